//! A fast path for ASCII text through a BERT tokenizer (BertNormalizer, BertPreTokenizer,
//! WordPiece: MiniLM, BGE, E5, GTE...), giving the very ids `Tokenizer::encode_fast` gives.
//!
//! Measured: at ~20-token queries, the `tokenizers` crate's general path was a third of this
//! gateway's CPU a request, a tenth of it in Unicode category lookups (a binary search per
//! character), the rest in its offset-tracking normalized strings and per-token allocations.
//! On ASCII every Unicode step of the normalizer is a byte rule or nothing (accents,
//! Chinese characters), so the text is normalized, split and looked up in one pass over its
//! bytes. Anything else (non-ASCII text, text holding an added token's spelling, any other
//! tokenizer) takes the general path; `Bert::of` checks itself against it before use.

use ahash::AHashMap;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, Tokenizer};

pub struct Bert {
    vocab: AHashMap<String, u32>,
    unk: u32,
    prefix: String,
    max_word_chars: usize,
    clean_text: bool,
    lowercase: bool,
    /// the special ids around one sequence ([CLS] ... [SEP])
    head: Vec<u32>,
    tail: Vec<u32>,
    /// added tokens' spellings, lowercased: a text holding one takes the general path
    added: Vec<String>,
}

/// Texts the self-check compares with the general path: each byte rule at least once.
const PROBES: [&str; 6] = [
    "Hello, world! The quick brown fox.",
    "  tabs\tnew\nlines\r\x0bvt\x0cff \x00nul \x1fus \x7fdel end  ",
    "UPPER lower MiXeD 12345 3.14 e-mail@example.com snake_case #1 (a) [b] {c} <d> \"e\" 'f' `g` ~h ^i |j \\k",
    "unaffable supercalifragilisticexpialidocious antidisestablishmentarianism",
    "a",
    "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz x",
];

impl Bert {
    /// The fast path of `tok` (with its truncation and padding off), if it is a BERT tokenizer
    /// and agrees with the general path on every probe.
    pub fn of(tok: &Tokenizer) -> Option<Bert> {
        let Some(NormalizerWrapper::BertNormalizer(norm)) = tok.get_normalizer() else {
            return None;
        };
        let Some(PreTokenizerWrapper::BertPreTokenizer(_)) = tok.get_pre_tokenizer() else {
            return None;
        };
        let ModelWrapper::WordPiece(wp) = tok.get_model() else {
            return None;
        };
        // The specials around "a" (one word, a token in every BERT vocabulary).
        let one = tok.encode_fast("a", true).ok()?;
        let mask = one.get_special_tokens_mask();
        let first = mask.iter().position(|&m| m == 0)?;
        let last = mask.iter().rposition(|&m| m == 0)?;
        if first != last {
            return None;
        }
        let ids = one.get_ids();
        let added = tok
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        let bert = Bert {
            unk: wp.token_to_id(&wp.unk_token)?,
            vocab: wp.get_vocab().into_iter().collect(),
            prefix: wp.continuing_subword_prefix.clone(),
            max_word_chars: wp.max_input_chars_per_word,
            clean_text: norm.clean_text,
            lowercase: norm.lowercase,
            head: ids[..first].to_vec(),
            tail: ids[last + 1..].to_vec(),
            added,
        };
        let agrees = PROBES.iter().all(|p| {
            let general = tok.encode_fast(*p, true).ok();
            general.is_some_and(|g| bert.ids(p).as_deref() == Some(g.get_ids()))
        });
        agrees.then_some(bert)
    }

    /// The ids of `text` with the specials around it, or None where the general path must
    /// answer (non-ASCII text, an added token's spelling in it).
    pub fn ids(&self, text: &str) -> Option<Vec<u32>> {
        if !text.is_ascii() {
            return None;
        }
        let mut normalized = Vec::with_capacity(text.len());
        for &b in text.as_bytes() {
            let c = char::from(b);
            let b = if self.clean_text {
                // BertNormalizer's clean_text on ASCII: controls (Cc) but tab, newline and
                // carriage return go; those three and whitespace become a space.
                if matches!(c, '\t' | '\n' | '\r') || (!c.is_control() && c.is_whitespace()) {
                    b' '
                } else if c.is_control() {
                    continue;
                } else {
                    b
                }
            } else {
                b
            };
            // Accents and Chinese characters are not ASCII: only the lowercasing is left.
            normalized.push(if self.lowercase {
                b.to_ascii_lowercase()
            } else {
                b
            });
        }
        let normalized = String::from_utf8(normalized).ok()?;
        // Added tokens match on the raw text or the normalized one: both are looked at, case
        // folded (already so when the normalizer lowercases).
        let lower = text.to_ascii_lowercase();
        let folded = if self.lowercase {
            std::borrow::Cow::Borrowed(normalized.as_str())
        } else {
            std::borrow::Cow::Owned(normalized.to_ascii_lowercase())
        };
        if self
            .added
            .iter()
            .any(|a| lower.contains(a.as_str()) || folded.contains(a.as_str()))
        {
            return None;
        }
        let mut out = Vec::with_capacity(self.head.len() + text.len() / 3 + self.tail.len());
        out.extend_from_slice(&self.head);
        let mut buffer = String::new();
        // BertPreTokenizer: whitespace splits and goes, punctuation is a word of its own.
        let mut start = None;
        for (i, c) in normalized.char_indices() {
            let boundary = c.is_whitespace() || c.is_ascii_punctuation();
            if boundary {
                if let Some(s) = start.take() {
                    self.word(&normalized[s..i], &mut out, &mut buffer);
                }
                if c.is_ascii_punctuation() {
                    self.word(&normalized[i..=i], &mut out, &mut buffer);
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        if let Some(s) = start {
            self.word(&normalized[s..], &mut out, &mut buffer);
        }
        out.extend_from_slice(&self.tail);
        Some(out)
    }

    /// WordPiece's greedy longest-match-first over one ASCII word, as `WordPiece::tokenize`
    /// (a word too long, or with a piece the vocabulary lacks, is one unknown token).
    fn word(&self, word: &str, out: &mut Vec<u32>, buffer: &mut String) {
        if word.len() > self.max_word_chars {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while start < end {
                buffer.clear();
                if start > 0 {
                    buffer.push_str(&self.prefix);
                }
                buffer.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(buffer.as_str()) {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
            let Some(id) = found else {
                out.truncate(mark);
                out.push(self.unk);
                return;
            };
            out.push(id);
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minilm() -> Tokenizer {
        let dir = std::env::var("EMBEDFLEET_TEST_MODEL").unwrap_or_default();
        let model =
            crate::model::dir::load(&dir, "auto").expect("the bundled MiniLM must be found");
        let mut tok = Tokenizer::from_file(model.path.join("tokenizer.json")).unwrap();
        tok.with_truncation(None).unwrap();
        tok.with_padding(None);
        tok
    }

    /// xorshift64: the same texts every run, no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    #[test]
    fn random_ascii_gets_the_general_paths_ids() {
        let tok = minilm();
        let bert = Bert::of(&tok).expect("MiniLM is a BERT tokenizer");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let words = [
            "the",
            "The",
            "QUICK",
            "unaffable",
            "don't",
            "e-mail",
            "3.14",
            "x",
            "[UNK",
            "##ing",
            "hello!?",
            "...",
            "mask]",
            "[",
            "SEP",
        ];
        // Rarer: an added token's spelling, or non-ASCII text (the general path's).
        let others = [
            "[CLS]", "[mask]", "naïve", "日本", "ﬁ", "a\u{301}", "\u{200b}",
        ];
        let gaps = [
            " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x00", "\x1f", "\x7f", "",
        ];
        let (mut fast, mut general) = (0, 0);
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(1 + rng.next() % 12) {
                let odd = rng.next().is_multiple_of(40);
                text.push_str(rng.pick(if odd { &others } else { &words }));
                text.push_str(rng.pick(&gaps));
            }
            if rng.next().is_multiple_of(10) {
                // Every ASCII byte, and words past WordPiece's 100 characters.
                text.push(char::from((rng.next() % 128) as u8));
                text.push_str(&"ab".repeat((rng.next() % 80) as usize));
            }
            let want = tok.encode_fast(text.as_str(), true).unwrap();
            match bert.ids(&text) {
                Some(ids) => {
                    fast += 1;
                    assert_eq!(ids, want.get_ids(), "{text:?}");
                }
                None => general += 1,
            }
        }
        // Both paths were taken, the fast one most.
        assert!(
            fast > 5_000 && general > 1_000,
            "{fast} fast, {general} general"
        );
    }

    #[test]
    fn an_added_tokens_spelling_or_non_ascii_text_takes_the_general_path() {
        let bert = Bert::of(&minilm()).unwrap();
        assert_eq!(bert.ids("hi"), Some(vec![101, 7632, 102]));
        assert!(bert.ids("a [MASK] b").is_none());
        assert!(bert.ids("a [mask] b").is_none());
        assert!(bert.ids("[MA\u{1}SK]").is_none());
        assert!(bert.ids("café").is_none());
    }
}
