//! Tokenization: tokenizer.json with its baked-in truncation and padding removed, special
//! tokens added, and over-long texts found on a character window of the text so a huge string
//! is never tokenized whole.

use tokenizers::{
    PostProcessor, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::api::errors::ApiError;
use crate::api::request::Side;
use crate::model::dir::{Head, ModelDir, Pylate};
use crate::plan::windows::special_ends;
use crate::plan::wordpiece::Bert;
use crate::telemetry::logs::Limiter;

/// One line per 10 s: a client can cause a failure per request.
static FAILED_LOG: Limiter = Limiter::new(std::time::Duration::from_secs(10));

/// The 500 of a tokenizer error, logged without the error: a client can cause it at any rate, and
/// the error may quote its text.
fn tokenizer_failed() -> ApiError {
    if let Some(held) = FAILED_LOG.allow(std::time::Instant::now()) {
        tracing::error!(suppressed = held, "tokenizer failed");
    }
    ApiError::Internal {}
}

const GROWTH: usize = 4;

/// Texts' whole ids, and each one's special tokens at its start and end.
pub type Windowable = (Vec<Vec<u32>>, Vec<(usize, usize)>);

/// A window of a text: `cut` when it holds more than the wanted tokens, and then `exact` of its
/// tokens are known to be the whole text's own.
#[derive(Debug, PartialEq, Eq)]
pub struct Window<'a> {
    pub text: &'a str,
    pub cut: bool,
    pub exact: usize,
}

/// Tokens not in the two words nearest the cut (the end for right, the start for left).
pub fn exact_tokens(word_ids: &[Option<u32>], side: Side) -> usize {
    let words: Vec<i64> = word_ids.iter().flatten().map(|&w| i64::from(w)).collect();
    let (Some(&first), Some(&last)) = (words.first(), words.last()) else {
        return 0;
    };
    match side {
        Side::Right => words.iter().filter(|&&w| w < last - 1).count(),
        Side::Left => words.iter().filter(|&&w| w > first + 1).count(),
    }
}

/// The first (right) or last (left) `chars` characters of `text`.
fn piece(text: &str, chars: usize, side: Side) -> &str {
    match side {
        Side::Right => text
            .char_indices()
            .nth(chars)
            .map_or(text, |(i, _)| &text[..i]),
        Side::Left => {
            let total = text.chars().count();
            text.char_indices()
                .nth(total.saturating_sub(chars))
                .map_or("", |(i, _)| &text[i..])
        }
    }
}

/// The Qwen3-Reranker judging frame (the model card's): the chat turns around each
/// (instruction, query, document) body, the system prompt as the model card gives it.
const JUDGE_PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the \
    requirements based on the Query and the Instruct provided. Note that the answer can only be \
    \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
const JUDGE_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// The user turn between the frame's prefix and suffix.
fn judge_body(instruction: &str, query: &str, document: &str) -> String {
    format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}")
}

/// 400 context_length_exceeded; `param` "input" also offers splitting into windows.
pub fn too_long(
    index: usize,
    length: usize,
    limit: usize,
    param: &'static str,
    at_least: bool,
) -> ApiError {
    let count = if at_least {
        format!("at least {length}")
    } else {
        length.to_string()
    };
    let split = if param == "input" {
        ", or \"split_long_inputs\": true to embed it in windows"
    } else {
        ""
    };
    ApiError::TooLong {
        param,
        index,
        count,
        limit,
        split,
    }
}

/// Token-id inputs and judged bodies carry no special tokens: truncation is a plain slice.
fn cut(ids: &[u32], limit: usize, side: Side) -> &[u32] {
    match side {
        Side::Left => &ids[ids.len().saturating_sub(limit)..],
        Side::Right => &ids[..limit.min(ids.len())],
    }
}

/// A token as TEI's /tokenize shows it: `span`, its byte offsets in the text (None for a special
/// token, whose `text` is its own spelling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub span: Option<(usize, usize)>,
}

pub struct Tokenization {
    plain: Tokenizer,
    /// the ASCII fast path of a BERT tokenizer (wordpiece.rs); None for other tokenizers
    fast: Option<Bert>,
    left: Tokenizer,
    right: Tokenizer,
    pub max_tokens: usize,
    pub vocab_size: usize,
    first_chars: usize,
    /// a yes/no reranker's judging frame, tokenized (prefix, suffix); empty for other models
    frame: (Vec<u32>, Vec<u32>),
    /// a PyLate ColBERT's rules as token ids
    pub pylate: Option<PylateIds>,
}

/// PyLate's rules (model/dir.rs `Pylate`) resolved against the vocabulary.
pub struct PylateIds {
    query_prefix: u32,
    document_prefix: u32,
    query_length: usize,
    document_length: usize,
    /// the mask token queries are padded with; None without query expansion
    expansion: Option<u32>,
    /// whether the other tokens attend to the expansion tokens
    attend_to_expansion: bool,
    skiplist: std::collections::HashSet<u32>,
}

impl PylateIds {
    fn new(tok: &Tokenizer, rules: &Pylate) -> Result<Self, String> {
        // A marker is one token, as its text or without its trailing space ("[Q] ").
        let id = |t: &str| {
            tok.token_to_id(t)
                .or_else(|| tok.token_to_id(t.trim()))
                .ok_or_else(|| format!("PyLate token '{t}' is not in the vocabulary"))
        };
        Ok(PylateIds {
            query_prefix: id(&rules.query_prefix)?,
            document_prefix: id(&rules.document_prefix)?,
            query_length: rules.query_length,
            document_length: rules.document_length,
            expansion: match rules.query_expansion {
                true => Some(id(&rules.mask_token)?),
                false => None,
            },
            attend_to_expansion: rules.attend_to_expansion,
            skiplist: rules
                .skiplist
                .iter()
                .filter_map(|w| tok.token_to_id(w))
                .collect(),
        })
    }

    /// A text's ids (its special tokens included) as PyLate encodes it: cut to one less than
    /// the query or document length keeping its last (closing) token, the marker inserted
    /// after its first token, and a query padded with the mask token to the query length.
    /// Returns how many of its leading tokens are attention keys: all of them but expansion
    /// tokens not attended to (each still gets its vector).
    pub fn encode(&self, ids: &mut Vec<u32>, query: bool) -> usize {
        let (prefix, length) = match query {
            true => (self.query_prefix, self.query_length),
            false => (self.document_prefix, self.document_length),
        };
        if ids.len() > length - 1 {
            let last = ids[ids.len() - 1];
            ids.truncate(length - 2);
            ids.push(last);
        }
        ids.insert(1.min(ids.len()), prefix);
        let keys = ids.len();
        if let (true, Some(mask)) = (query, self.expansion) {
            ids.resize(length, mask);
        }
        match self.attend_to_expansion {
            true => ids.len(),
            false => keys,
        }
    }

    /// Whether a document's token `id` keeps its vector (PyLate's skip-list drops it).
    pub fn keeps(&self, id: u32) -> bool {
        !self.skiplist.contains(&id)
    }
}

fn load_tokenizer(model: &ModelDir) -> Result<Tokenizer, String> {
    let file = model.path.join("tokenizer.json");
    if !file.is_file() {
        return Err(format!("{} has no tokenizer.json", model.path.display()));
    }
    let mut tok = Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    // Some packaged tokenizer.json files (MiniLM's) truncate and pad to 128: limits are ours.
    tok.with_truncation(None).map_err(|e| e.to_string())?;
    tok.with_padding(None);
    Ok(tok)
}

impl Tokenization {
    pub fn new(model: &ModelDir, max_tokens: usize) -> Result<Self, String> {
        let plain = load_tokenizer(model)?;
        let cutting = |direction| -> Result<Tokenizer, String> {
            let mut tok = load_tokenizer(model)?;
            let params = TruncationParams {
                direction,
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            };
            tok.with_truncation(Some(params))
                .map_err(|e| e.to_string())?;
            Ok(tok)
        };
        // A first window that holds the wanted tokens of ordinary text: each token's longest
        // spelling in the vocabulary plus one separator.
        let longest = plain
            .get_vocab(true)
            .keys()
            .map(|t| t.chars().count())
            .max()
            .unwrap_or(16);
        let mut frame = (Vec::new(), Vec::new());
        if model.head == Head::YesNo {
            let free = |text| {
                Self::encode(&plain, text, false, false)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|_| {
                        format!(
                            "{}: the judging prompt does not tokenize",
                            model.path.display()
                        )
                    })
            };
            frame = (free(JUDGE_PREFIX)?, free(JUDGE_SUFFIX)?);
            if frame.0.len() + frame.1.len() >= max_tokens {
                return Err(format!(
                    "max input tokens {max_tokens} leave no room inside the judging prompt"
                ));
            }
        }
        let pylate = match &model.pylate {
            Some(rules) => Some(
                PylateIds::new(&plain, rules)
                    .map_err(|e| format!("{}: {e}", model.path.display()))?,
            ),
            None => None,
        };
        Ok(Tokenization {
            pylate,
            left: cutting(TruncationDirection::Left)?,
            right: cutting(TruncationDirection::Right)?,
            first_chars: (max_tokens + 1) * (longest + 1),
            max_tokens,
            vocab_size: model.vocab_size,
            fast: Bert::of(&plain),
            plain,
            frame,
        })
    }

    /// Special tokens added to a pair.
    pub fn pair_specials(&self) -> usize {
        self.plain
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(true))
    }

    fn cutting(&self, truncate: bool, side: Side) -> &Tokenizer {
        match (truncate, side) {
            (false, _) => &self.plain,
            (true, Side::Left) => &self.left,
            (true, Side::Right) => &self.right,
        }
    }

    /// Tokens of `text` without special tokens.
    fn content_tokens(&self, text: &str) -> Result<usize, ApiError> {
        Ok(Self::encode(&self.plain, text, false, false)?.len())
    }

    /// A cross-encoder's (query, document) pairs: ids and type ids, longest-first truncation
    /// (`truncate`) or 400 past the limit (`param` documents).
    #[allow(clippy::type_complexity)]
    pub fn pairs(
        &self,
        pairs: &[(String, String)],
        truncate: bool,
        side: Side,
    ) -> Result<(Vec<Vec<u32>>, Vec<Vec<u32>>), ApiError> {
        let mut windows = Vec::with_capacity(pairs.len());
        for (a, b) in pairs {
            windows.push((self.window(a, side)?, self.window(b, side)?));
        }
        if !truncate {
            for (i, (wa, wb)) in windows.iter().enumerate() {
                let w = if wa.cut { wa } else { wb };
                if w.cut {
                    return Err(too_long(i, w.exact, self.max_tokens, "documents", true));
                }
            }
        }
        let tok = self.cutting(truncate, side);
        let (mut ids, mut types) = (
            Vec::with_capacity(pairs.len()),
            Vec::with_capacity(pairs.len()),
        );
        for ((a, b), (wa, wb)) in pairs.iter().zip(&windows) {
            let (a, b) = self.fit_pair(a, b, wa, wb)?;
            let enc = tok
                .encode_fast((a, b), true)
                .map_err(|_| tokenizer_failed())?;
            ids.push(enc.get_ids().to_vec());
            types.push(enc.get_type_ids().to_vec());
        }
        if !truncate {
            if let Some((i, seq)) = ids
                .iter()
                .enumerate()
                .find(|(_, s)| s.len() > self.max_tokens)
            {
                return Err(too_long(i, seq.len(), self.max_tokens, "documents", false));
            }
        }
        Ok((ids, types))
    }

    /// Longest-first truncation gives the odd token to the longer side, so a side may be cut
    /// only while it stays the longer one: when its exact tokens outnumber the other whole
    /// side's. Both sides over the limit leave their order unknown: tokenized whole.
    fn fit_pair<'a>(
        &self,
        a: &'a str,
        b: &'a str,
        wa: &Window<'a>,
        wb: &Window<'a>,
    ) -> Result<(&'a str, &'a str), ApiError> {
        if wa.cut == wb.cut {
            return Ok((a, b));
        }
        if wa.cut {
            let other = self.content_tokens(b)?;
            return Ok((if wa.exact > other { wa.text } else { a }, b));
        }
        let other = self.content_tokens(a)?;
        Ok((a, if wb.exact > other { wb.text } else { b }))
    }

    /// (query, document) pairs in a yes/no reranker's judging frame, one sequence each: only
    /// the body is ever cut.
    pub fn judged_pairs(
        &self,
        pairs: &[(String, String)],
        instruction: &str,
        truncate: bool,
        side: Side,
    ) -> Result<Vec<Vec<u32>>, ApiError> {
        let (prefix, suffix) = &self.frame;
        let frame = prefix.len() + suffix.len();
        let room = self.max_tokens - frame;
        let bodies: Vec<String> = pairs
            .iter()
            .map(|(q, d)| judge_body(instruction, q, d))
            .collect();
        let mut windows = Vec::with_capacity(bodies.len());
        for (i, body) in bodies.iter().enumerate() {
            let w = self.window(body, side)?;
            if w.cut && !truncate {
                return Err(too_long(
                    i,
                    w.exact + frame,
                    self.max_tokens,
                    "documents",
                    true,
                ));
            }
            windows.push(w);
        }
        let mut out = Vec::with_capacity(windows.len());
        for (i, w) in windows.iter().enumerate() {
            let enc = Self::encode(&self.plain, w.text, false, false)?;
            let mut ids = enc.get_ids();
            if ids.len() > room {
                if !truncate {
                    return Err(too_long(
                        i,
                        ids.len() + frame,
                        self.max_tokens,
                        "documents",
                        false,
                    ));
                }
                ids = cut(ids, room, side);
            }
            out.push([prefix.as_slice(), ids, suffix.as_slice()].concat());
        }
        Ok(out)
    }

    /// Special tokens added to one text.
    pub fn specials(&self) -> usize {
        self.plain
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false))
    }

    /// Ids (and word ids, which `encode_fast` leaves out: windows need them).
    fn encode(
        tok: &Tokenizer,
        text: &str,
        special: bool,
        words: bool,
    ) -> Result<tokenizers::Encoding, ApiError> {
        let encoded = if words {
            tok.encode(text, special)
        } else {
            tok.encode_fast(text, special)
        };
        encoded.map_err(|_| tokenizer_failed())
    }

    /// The shortest tried cut of `text` whose first (right) or last (left) `tokens` tokens are
    /// exactly the whole text's, or the whole text when it has fewer.
    pub fn window<'a>(&self, text: &'a str, side: Side) -> Result<Window<'a>, ApiError> {
        // One more than the limit: a cut text then certainly overflows it.
        let tokens = self.max_tokens + 1;
        let chars = text.chars().count();
        let mut size = self.first_chars;
        while size < chars {
            let cut = piece(text, size, side);
            let enc = Self::encode(&self.plain, cut, false, true)?;
            let exact = exact_tokens(enc.get_word_ids(), side);
            if exact >= tokens {
                return Ok(Window {
                    text: cut,
                    cut: true,
                    exact,
                });
            }
            size *= GROWTH;
        }
        Ok(Window {
            text,
            cut: false,
            exact: 0,
        })
    }

    /// Token ids of each text (prompt prepended), in order; over-long ones cut (`truncate`) or
    /// refused with 400 context_length_exceeded.
    pub fn texts(
        &self,
        texts: &[String],
        prompt: &str,
        truncate: bool,
        side: Side,
    ) -> Result<Vec<Vec<u32>>, ApiError> {
        let items: Vec<std::borrow::Cow<str>> = texts
            .iter()
            .map(|t| {
                if prompt.is_empty() {
                    std::borrow::Cow::Borrowed(t.as_str())
                } else {
                    std::borrow::Cow::Owned(format!("{prompt}{t}"))
                }
            })
            .collect();
        let mut windows = Vec::with_capacity(items.len());
        for item in &items {
            windows.push(self.window(item, side)?);
        }
        if !truncate {
            if let Some((i, w)) = windows.iter().enumerate().find(|(_, w)| w.cut) {
                return Err(too_long(i, w.exact, self.max_tokens, "input", true));
            }
        }
        let tok = self.cutting(truncate, side);
        let mut out = Vec::with_capacity(windows.len());
        for (i, w) in windows.iter().enumerate() {
            // What fits needs no truncation: the fast path's ids are the general path's.
            let fast = self.fast.as_ref().and_then(|f| f.ids(w.text));
            if let Some(ids) = fast.filter(|ids| ids.len() <= self.max_tokens) {
                out.push(ids);
                continue;
            }
            let ids = Self::encode(tok, w.text, true, false)?.get_ids().to_vec();
            if !truncate && ids.len() > self.max_tokens {
                return Err(too_long(i, ids.len(), self.max_tokens, "input", false));
            }
            out.push(ids);
        }
        Ok(out)
    }

    /// Texts (prompt prepended) tokenized whole, however long, with each one's special ends:
    /// their windows are cut from the tokens (`split_long_inputs`).
    pub fn whole_texts(&self, texts: &[String], prompt: &str) -> Result<Windowable, ApiError> {
        let mut ids = Vec::with_capacity(texts.len());
        let mut ends = Vec::with_capacity(texts.len());
        for text in texts {
            let enc = if prompt.is_empty() {
                Self::encode(&self.plain, text, true, false)?
            } else {
                Self::encode(&self.plain, &format!("{prompt}{text}"), true, false)?
            };
            ends.push(special_ends(enc.get_special_tokens_mask()));
            ids.push(enc.get_ids().to_vec());
        }
        Ok((ids, ends))
    }

    /// Each token of `text` (TEI's /tokenize): the whole text, untruncated, with the special
    /// tokens when `special`.
    pub fn tokens(&self, text: &str, special: bool) -> Result<Vec<Token>, ApiError> {
        let enc = Self::encode(&self.plain, text, special, true)?;
        let mask = enc.get_special_tokens_mask();
        let tokens = enc
            .get_ids()
            .iter()
            .zip(enc.get_offsets())
            .zip(enc.get_tokens());
        Ok(tokens
            .zip(mask)
            .map(|(((&id, &(start, stop)), token), &special)| match special {
                1 => Token {
                    id,
                    text: token.clone(),
                    special: true,
                    span: None,
                },
                _ => Token {
                    id,
                    // Offsets are bytes; a token inside a character shows its bytes lossily.
                    text: String::from_utf8_lossy(text.as_bytes().get(start..stop).unwrap_or(&[]))
                        .into_owned(),
                    special: false,
                    span: Some((start, stop)),
                },
            })
            .collect())
    }

    /// The text of token ids (TEI's /decode), checked against the vocabulary.
    pub fn decode(&self, seqs: &[Vec<i64>], skip_special: bool) -> Result<Vec<String>, ApiError> {
        let mut out = Vec::with_capacity(seqs.len());
        for (index, seq) in seqs.iter().enumerate() {
            if seq.iter().any(|&t| t < 0 || t >= self.vocab_size as i64) {
                return Err(ApiError::IdOutsideVocabulary {
                    index,
                    vocab: self.vocab_size,
                });
            }
            let ids: Vec<u32> = seq.iter().map(|&t| t as u32).collect();
            let text = self.plain.decode(&ids, skip_special);
            out.push(text.map_err(|_| tokenizer_failed())?);
        }
        Ok(out)
    }

    /// Checked token-id inputs: no special tokens are added, so truncation is a plain slice;
    /// with `whole`, over-long ones are kept for splitting into windows.
    pub fn token_ids(
        &self,
        seqs: &[Vec<i64>],
        truncate: bool,
        side: Side,
        whole: bool,
    ) -> Result<Vec<Vec<u32>>, ApiError> {
        let vocab = self.vocab_size as i64;
        let mut out = Vec::with_capacity(seqs.len());
        for (i, seq) in seqs.iter().enumerate() {
            if seq.is_empty() {
                return Err(ApiError::EmptyIds { index: i });
            }
            if seq.iter().any(|&t| t < 0 || t >= vocab) {
                return Err(ApiError::IdOutsideVocabulary {
                    index: i,
                    vocab: self.vocab_size,
                });
            }
            let mut ids: &[i64] = seq;
            if ids.len() > self.max_tokens && !whole {
                if !truncate {
                    return Err(too_long(i, ids.len(), self.max_tokens, "input", false));
                }
                ids = match side {
                    Side::Left => &ids[ids.len() - self.max_tokens..],
                    Side::Right => &ids[..self.max_tokens],
                };
            }
            out.push(ids.iter().map(|&t| t as u32).collect());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_tokens_drop_the_two_words_at_the_cut() {
        let words = [Some(0), Some(1), Some(1), Some(2), Some(3), Some(3)];
        assert_eq!(exact_tokens(&words, Side::Right), 3); // words 0, 1, 1
        assert_eq!(exact_tokens(&words, Side::Left), 3); // words 2, 3, 3
        assert_eq!(exact_tokens(&[None, None], Side::Right), 0);
    }

    #[test]
    fn pylate_marks_cuts_and_expands() {
        let rules = PylateIds {
            query_prefix: 7,
            document_prefix: 8,
            query_length: 6,
            document_length: 5,
            expansion: Some(4),
            attend_to_expansion: false,
            skiplist: [13].into(),
        };
        let mut query = vec![2, 10, 3];
        // padded with the mask token to 6; the 2 expansion tokens are no keys
        assert_eq!(rules.encode(&mut query, true), 4);
        assert_eq!(query, [2, 7, 10, 3, 4, 4]);
        let mut long = vec![2, 10, 11, 12, 13, 14, 15, 3];
        assert_eq!(rules.encode(&mut long, true), 6); // nothing to expand: all keys
        assert_eq!(long, [2, 7, 10, 11, 12, 3]); // cut to 5 keeping [SEP], then marked
        let mut document = long.clone();
        assert_eq!(rules.encode(&mut document, false), 5);
        assert_eq!(document, [2, 8, 7, 10, 3]); // no expansion for documents
        assert!(!rules.keeps(13) && rules.keeps(14));
        let attended = PylateIds {
            attend_to_expansion: true,
            ..rules
        };
        let mut query = vec![2, 10, 3];
        assert_eq!(attended.encode(&mut query, true), 6); // every token a key
        assert_eq!(query, [2, 7, 10, 3, 4, 4]);
        let plain = PylateIds {
            expansion: None,
            ..attended
        };
        let mut short = vec![2, 10, 3];
        assert_eq!(plain.encode(&mut short, true), 4);
        assert_eq!(short, [2, 7, 10, 3]);
    }

    #[test]
    fn pieces_count_characters_not_bytes() {
        assert_eq!(piece("héllo", 2, Side::Right), "hé");
        assert_eq!(piece("héllo", 4, Side::Left), "éllo");
        assert_eq!(piece("ab", 5, Side::Left), "ab");
    }

    /// The bundled MiniLM (EMBEDFLEET_TEST_MODEL, else found as the binary finds it): its ids
    /// for known texts, as the reference tokenizers library gives them.
    fn minilm() -> Tokenization {
        let dir = std::env::var("EMBEDFLEET_TEST_MODEL").unwrap_or_default();
        let model =
            crate::model::dir::load(&dir, "auto").expect("the bundled MiniLM must be found");
        Tokenization::new(&model, 256).unwrap()
    }

    #[test]
    fn ids_equal_the_reference_tokenizer() {
        let t = minilm();
        let ids = t
            .texts(&["Hello, world!".into()], "", false, Side::Right)
            .unwrap();
        assert_eq!(ids, vec![vec![101, 7592, 1010, 2088, 999, 102]]);
        let ids = t
            .texts(&["The quick brown fox".into()], "", false, Side::Right)
            .unwrap();
        assert_eq!(ids, vec![vec![101, 1996, 4248, 2829, 4419, 102]]);
    }

    #[test]
    fn long_texts_are_refused_or_cut_keeping_special_tokens() {
        let t = minilm();
        let long = vec!["word ".repeat(5000)];
        let err = t.texts(&long, "", false, Side::Right).unwrap_err();
        assert_eq!(err.code(), Some("context_length_exceeded"));
        assert!(
            err.message().starts_with("Input 0 has at least "),
            "{}",
            err.message()
        );
        for side in [Side::Left, Side::Right] {
            let ids = t.texts(&long, "", true, side).unwrap();
            assert_eq!(ids[0].len(), 256);
            assert_eq!((ids[0][0], ids[0][255]), (101, 102));
        }
    }

    #[test]
    fn token_ids_are_checked_and_sliced() {
        let t = minilm();
        let seqs: Vec<Vec<i64>> = vec![(1..=300).collect()];
        let ids = t.token_ids(&seqs, true, Side::Left, false).unwrap();
        assert_eq!((ids[0].len(), ids[0][0]), (256, 45));
        assert!(t.token_ids(&seqs, false, Side::Right, false).is_err());
        assert!(t.token_ids(&[vec![]], false, Side::Right, false).is_err());
        assert!(t
            .token_ids(&[vec![30522]], false, Side::Right, false)
            .is_err());
    }
}
