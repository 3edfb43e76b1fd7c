//! Admission: taking or shedding a request before it is tokenized, by the seconds of work
//! ahead. Shedding before tokenization keeps an overloaded gateway's CPU for the requests it
//! takes; counting seconds (not requests) treats a 1-token and a 10,000-token request fairly.
//!
//! The work ahead of a new request is what this gateway admitted and has not answered (an
//! estimate from characters until tokenized, then the true count) plus what other gateways
//! queued at the usable workers; over the fleet's capacity (the workers' measured tokens/s times
//! the delivered ratio learned while the queue stays deep) it is seconds. A request is admitted
//! while that is within `--max-queue-seconds`, else 429 with the seconds until it is back.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::api::errors::{short_number, ApiError};
use crate::api::request::{ClassifyRequest, Input, RerankRequest, ScoreRequest};
use crate::model::dir::{ModelDir, Task};
use prometheus::IntCounter;

/// The estimate before any request was tokenized: 4 characters per token errs towards more.
pub const FIRST_CHARS_PER_TOKEN: f64 = 4.0;
/// Weight of one request's measured ratio in the running estimate, and its bounds.
pub const LEARNING_RATE: f64 = 0.2;
pub const MIN_CHARS_PER_TOKEN: f64 = 0.25;
pub const MAX_CHARS_PER_TOKEN: f64 = 64.0;
/// The delivered throughput is sampled over periods this long with at least this many answers,
/// in which the queue never fell below `BACKLOG_SECONDS` of work (the workers were saturated).
pub const SAMPLE_SECONDS: f64 = 2.0;
pub const SAMPLE_ANSWERS: u64 = 4;
pub const BACKLOG_SECONDS: f64 = 1.0;
/// Weight of one period's sample in the running ratio, and the ratio's bounds.
pub const DELIVERED_RATE: f64 = 0.3;
pub const MIN_DELIVERED: f64 = 0.05;
pub const MAX_DELIVERED: f64 = 2.0;

// --- decisions (pure) ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub admit: bool,
    /// seconds of work queued ahead of the request (0 when the capacity is unknown)
    pub queued_seconds: f64,
    /// for a shed request: whole seconds until the queue is back within the bound (at least 1)
    pub retry_after: u64,
}

/// Admit while the work ahead, in seconds at the fleet's capacity, is within the bound; with no
/// measured capacity there is nothing to measure the queue by: admitted.
pub fn decide(queued_tokens: f64, capacity: f64, bound_seconds: f64) -> Verdict {
    if capacity <= 0.0 {
        return Verdict {
            admit: true,
            queued_seconds: 0.0,
            retry_after: 0,
        };
    }
    let seconds = queued_tokens.max(0.0) / capacity;
    if seconds <= bound_seconds {
        return Verdict {
            admit: true,
            queued_seconds: seconds,
            retry_after: 0,
        };
    }
    Verdict {
        admit: false,
        queued_seconds: seconds,
        retry_after: ((seconds - bound_seconds).ceil() as u64).max(1),
    }
}

/// The running delivered/measured ratio after one sample period; only a period whose queue
/// stayed backlogged says what the fleet can do (a shallow queue is demand-bound).
pub fn delivered_ratio(
    current: f64,
    served_tokens: u64,
    seconds: f64,
    capacity: f64,
    backlogged: bool,
) -> f64 {
    if !backlogged || seconds <= 0.0 || capacity <= 0.0 {
        return current;
    }
    let sample = (served_tokens as f64 / seconds / capacity).clamp(MIN_DELIVERED, MAX_DELIVERED);
    (1.0 - DELIVERED_RATE) * current + DELIVERED_RATE * sample
}

/// A request's inputs as admission sees them, before tokenization.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Work {
    /// characters (code points) of each text input, prompt included
    pub chars: Vec<usize>,
    /// tokens of the token-id inputs, exact
    pub tokens: usize,
    /// the inputs are (query, document) pairs for a reranker: more special tokens each
    pub pairs: bool,
}

/// Each text's characters over the ratio plus its special tokens, capped at the model's limit;
/// token-id inputs as they are.
pub fn estimate_tokens(
    work: &Work,
    chars_per_token: f64,
    max_tokens: usize,
    specials: usize,
) -> usize {
    let texts: usize = work
        .chars
        .iter()
        .map(|&c| max_tokens.min((c as f64 / chars_per_token).ceil() as usize + specials))
        .sum();
    work.tokens + texts
}

/// The running ratio after one tokenized request, learned from its inputs that were not cut;
/// nothing when `chars` and `lengths` are not the same inputs (windows, deduplication).
pub fn learned_chars_per_token(
    current: f64,
    chars: &[usize],
    lengths: &[usize],
    max_tokens: usize,
    specials: usize,
) -> f64 {
    if chars.len() != lengths.len() {
        return current;
    }
    let (mut text, mut tokens) = (0usize, 0usize);
    for (&c, &n) in chars.iter().zip(lengths) {
        if n < max_tokens && n > specials {
            text += c;
            tokens += n - specials;
        }
    }
    if tokens == 0 {
        return current;
    }
    let sample = (text as f64 / tokens as f64).clamp(MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN);
    (1.0 - LEARNING_RATE) * current + LEARNING_RATE * sample
}

fn char_count(text: &str) -> usize {
    text.chars().count()
}

/// Distinct texts in first-seen order (a bi-encoder embeds each once).
fn distinct<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    texts.filter(|t| seen.insert(*t)).collect()
}

/// What an embeddings or sparse embeddings request asks for, in the shape the service
/// tokenizes it.
pub fn input_work(
    input: &Input,
    input_type: Option<&str>,
    truncate: bool,
    model: &ModelDir,
    max_tokens: usize,
) -> Work {
    match input {
        Input::Texts(texts) => {
            let prompt = char_count(model.prompt_for(input_type));
            Work {
                chars: texts.iter().map(|t| prompt + char_count(t)).collect(),
                ..Work::default()
            }
        }
        Input::Ids(seqs) => Work {
            chars: Vec::new(),
            pairs: false,
            tokens: seqs
                .iter()
                .map(|s| {
                    if truncate {
                        s.len().min(max_tokens)
                    } else {
                        s.len()
                    }
                })
                .sum(),
        },
    }
}

/// A classify request's texts (characters alone: admission counts no prompt for them).
pub fn classify_work(req: &ClassifyRequest) -> Work {
    Work {
        chars: req.input.iter().map(|t| char_count(t)).collect(),
        ..Work::default()
    }
}

/// (query, document) pairs as the service tokenizes them: a reranker's each as one input; a
/// bi-encoder's each distinct query with the query prompt, then each distinct document with
/// the document prompt.
fn pair_work<'a>(
    pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    model: &ModelDir,
) -> Work {
    if model.task == Task::Score {
        return Work {
            chars: pairs.map(|(a, b)| char_count(a) + char_count(b)).collect(),
            tokens: 0,
            pairs: true,
        };
    }
    let query = char_count(model.prompt_for(Some("query")));
    let document = char_count(model.prompt_for(Some("document")));
    let left = distinct(pairs.clone().map(|p| p.0))
        .into_iter()
        .map(|a| query + char_count(a));
    let right = distinct(pairs.map(|p| p.1))
        .into_iter()
        .map(|b| document + char_count(b));
    Work {
        chars: left.chain(right).collect(),
        ..Work::default()
    }
}

pub fn rerank_work(req: &RerankRequest, model: &ModelDir) -> Work {
    pair_work(
        req.documents
            .iter()
            .map(|d| (req.query.as_str(), d.as_str())),
        model,
    )
}

/// One-to-many and many-to-one repeat the single side; lists of different lengths are refused
/// later and cost nothing until then.
pub fn score_work(req: &ScoreRequest, model: &ModelDir) -> Work {
    let (firsts, seconds) = (&req.text_1.1, &req.text_2.1);
    let count = if firsts.is_empty() || seconds.is_empty() {
        0
    } else {
        firsts.len().max(seconds.len())
    };
    let pairs = (0..count).map(|i| {
        (
            firsts[i.min(firsts.len() - 1)].as_str(),
            seconds[i.min(seconds.len() - 1)].as_str(),
        )
    });
    pair_work(pairs, model)
}

// --- the state: admitted work and its tickets ---------------------------------------------------

struct State {
    /// tokens admitted and not answered (estimates until tokenized)
    queued: i64,
    chars_per_token: f64,
    delivered: f64,
    period_start: Instant,
    period_served: u64,
    period_answers: u64,
    backlogged: bool,
}

/// What admission reads from the worker pool: tokens other gateways queued at the usable
/// workers, and those workers' measured tokens/s together.
pub trait Fleet: Send + Sync {
    fn queued_elsewhere(&self) -> f64;
    fn capacity(&self) -> f64;
}

pub struct Admission {
    max_tokens: usize,
    specials: usize,
    pair_specials: usize,
    bound: f64,
    min_retry_after: u64,
    fleet: Arc<dyn Fleet>,
    state: Mutex<State>,
    /// requests answered 429 here (embedfleet_gateway_shed_requests_total)
    shed: IntCounter,
}

impl Admission {
    /// `specials` and `pair_specials`: the special tokens added to one text and to a pair.
    pub fn new(
        max_tokens: usize,
        (specials, pair_specials): (usize, usize),
        bound_seconds: f64,
        min_retry_after: u64,
        fleet: Arc<dyn Fleet>,
        shed: IntCounter,
    ) -> Self {
        Admission {
            max_tokens,
            specials,
            pair_specials,
            bound: bound_seconds,
            min_retry_after,
            fleet,
            state: Mutex::new(State {
                queued: 0,
                chars_per_token: FIRST_CHARS_PER_TOKEN,
                delivered: 1.0,
                period_start: Instant::now(),
                period_served: 0,
                period_answers: 0,
                backlogged: false,
            }),
            shed,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("admission lock")
    }

    /// Tokens this gateway admitted and has not answered.
    #[cfg(test)]
    pub fn queued_tokens(&self) -> i64 {
        self.state().queued
    }

    /// The delivered/measured ratio (embedfleet_gateway_delivered_capacity_ratio).
    pub fn delivered(&self) -> f64 {
        self.state().delivered
    }

    /// Seconds of work ahead of a request arriving now (embedfleet_gateway_queued_work_seconds).
    pub fn queued_seconds(&self) -> f64 {
        let s = self.state();
        let capacity = self.fleet.capacity() * s.delivered;
        decide(
            s.queued as f64 + self.fleet.queued_elsewhere(),
            capacity,
            f64::INFINITY,
        )
        .queued_seconds
    }

    /// A ticket for the request's `work`, or 429 when the queue is past its bound. The ticket
    /// gives the work back when dropped, however the request ended.
    pub fn admit(self: &Arc<Self>, work: Work) -> Result<Ticket, ApiError> {
        let mut s = self.state();
        self.sample(&mut s, Instant::now());
        let capacity = self.fleet.capacity() * s.delivered;
        let verdict = decide(
            s.queued as f64 + self.fleet.queued_elsewhere(),
            capacity,
            self.bound,
        );
        if !verdict.admit {
            self.shed.inc();
            return Err(ApiError::Shed {
                queued: format!("{:.1}", verdict.queued_seconds),
                bound: short_number(self.bound),
                retry_after: self.min_retry_after.max(verdict.retry_after),
            });
        }
        let tokens = estimate_tokens(
            &work,
            s.chars_per_token,
            self.max_tokens,
            self.specials_of(&work),
        );
        s.queued += tokens as i64;
        Ok(Ticket {
            admission: Arc::clone(self),
            work,
            tokens: AtomicU64::new(tokens as u64),
            answered: AtomicBool::new(false),
        })
    }

    fn specials_of(&self, work: &Work) -> usize {
        if work.pairs {
            self.pair_specials
        } else {
            self.specials
        }
    }

    /// Close the sample period once it is long enough; note whether the queue stayed deep.
    fn sample(&self, s: &mut State, now: Instant) {
        let capacity = self.fleet.capacity();
        if capacity > 0.0 && (s.queued as f64) < BACKLOG_SECONDS * capacity * s.delivered {
            s.backlogged = false;
        }
        let elapsed = now.duration_since(s.period_start).as_secs_f64();
        if elapsed < SAMPLE_SECONDS || (s.backlogged && s.period_answers < SAMPLE_ANSWERS) {
            return;
        }
        s.delivered = delivered_ratio(
            s.delivered,
            s.period_served,
            elapsed,
            capacity,
            s.backlogged,
        );
        s.period_start = now;
        s.period_served = 0;
        s.period_answers = 0;
        s.backlogged =
            capacity > 0.0 && s.queued as f64 >= BACKLOG_SECONDS * capacity * s.delivered;
    }
}

/// One admitted request's share of the queue.
pub struct Ticket {
    admission: Arc<Admission>,
    work: Work,
    /// the estimate until `tokenized`, then the true count; 0 once released
    tokens: AtomicU64,
    answered: AtomicBool,
}

impl Ticket {
    /// Replace the estimate by the true count of what goes to the workers, and learn from it.
    pub fn tokenized(&self, lengths: &[usize]) {
        let before = self.tokens.load(Ordering::Relaxed);
        if before == 0 {
            return;
        }
        let actual: usize = lengths.iter().sum();
        self.tokens.store(actual as u64, Ordering::Relaxed);
        let a = &self.admission;
        let mut s = a.state();
        s.queued += actual as i64 - before as i64;
        s.chars_per_token = learned_chars_per_token(
            s.chars_per_token,
            &self.work.chars,
            lengths,
            a.max_tokens,
            a.specials_of(&self.work),
        );
    }

    /// The request was answered: its tokens count as delivered when released.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let tokens = self.tokens.swap(0, Ordering::Relaxed);
        if tokens == 0 {
            return;
        }
        let a = &self.admission;
        let mut s = a.state();
        s.queued -= tokens as i64;
        if self.answered.load(Ordering::Relaxed) {
            s.period_served += tokens;
            s.period_answers += 1;
        }
        a.sample(&mut s, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(f64, f64);

    impl Fleet for Fixed {
        fn queued_elsewhere(&self) -> f64 {
            self.0
        }
        fn capacity(&self) -> f64 {
            self.1
        }
    }

    fn admission(elsewhere: f64, capacity: f64, bound: f64) -> Arc<Admission> {
        Arc::new(Admission::new(
            256,
            (2, 3),
            bound,
            1,
            Arc::new(Fixed(elsewhere, capacity)),
            IntCounter::new("shed", "shed").unwrap(),
        ))
    }

    #[test]
    fn decide_admits_within_the_bound_and_says_when_to_retry() {
        assert!(decide(0.0, 1000.0, 30.0).admit);
        assert!(decide(30_000.0, 1000.0, 30.0).admit);
        let shed = decide(30_001.0, 1000.0, 30.0);
        assert!(!shed.admit);
        assert_eq!(shed.retry_after, 1);
        assert_eq!(decide(95_000.0, 1000.0, 30.0).retry_after, 65);
        // no measured capacity: nothing to measure the queue by
        assert_eq!(decide(1e9, 0.0, 30.0).queued_seconds, 0.0);
        assert!(decide(1e9, 0.0, 30.0).admit);
    }

    #[test]
    fn estimates_cap_at_the_limit_and_count_ids_exactly() {
        let work = Work {
            chars: vec![40, 4000],
            tokens: 7,
            pairs: false,
        };
        // 40/4 + 2 specials, 4000 chars capped at 256, plus 7 ids
        assert_eq!(estimate_tokens(&work, 4.0, 256, 2), 12 + 256 + 7);
    }

    #[test]
    fn a_reranker_s_pairs_are_estimated_with_the_pair_s_special_tokens() {
        let a = admission(0.0, 0.0, 30.0);
        let pairs = a
            .admit(Work {
                chars: vec![40, 8],
                tokens: 0,
                pairs: true,
            })
            .unwrap();
        // 40/4 + 3 and 8/4 + 3: a pair's specials (3 here), not one text's (2)
        assert_eq!(a.queued_tokens(), 18);
        drop(pairs);
    }

    #[test]
    fn learning_skips_cut_inputs_and_mismatched_shapes() {
        // 100 chars in 20 content tokens: a sample of 5, moved a fifth of the way from 4
        let got = learned_chars_per_token(4.0, &[100, 9999], &[22, 256], 256, 2);
        assert!((got - 4.2).abs() < 1e-12, "{got}");
        assert_eq!(learned_chars_per_token(4.0, &[100], &[22, 3], 256, 2), 4.0);
        assert_eq!(learned_chars_per_token(4.0, &[100], &[256], 256, 2), 4.0);
    }

    #[test]
    fn delivered_ratio_learns_only_from_backlogged_periods() {
        assert_eq!(delivered_ratio(1.0, 500, 1.0, 1000.0, false), 1.0);
        let got = delivered_ratio(1.0, 500, 1.0, 1000.0, true);
        assert!((got - 0.85).abs() < 1e-12, "{got}");
        // bounded samples
        let floor = delivered_ratio(1.0, 0, 1.0, 1000.0, true);
        assert!((floor - (0.7 + 0.3 * MIN_DELIVERED)).abs() < 1e-12);
    }

    #[test]
    fn tickets_hold_their_work_until_dropped_and_shed_past_the_bound() {
        let a = admission(0.0, 10.0, 1.0);
        let first = a
            .admit(Work {
                chars: vec![40],
                ..Work::default()
            })
            .unwrap();
        assert_eq!(a.queued_tokens(), 12);
        first.tokenized(&[9]);
        assert_eq!(a.queued_tokens(), 9); // 0.9 s ahead: within the 1 s bound
        let second = a.admit(Work::default()).unwrap();
        let third = a
            .admit(Work {
                tokens: 5,
                ..Work::default()
            })
            .unwrap();
        assert_eq!(a.queued_tokens(), 14); // 1.4 s ahead now
        let shed = a.admit(Work::default()).err().unwrap();
        assert_eq!(shed.status(), 429);
        assert_eq!(
            shed.message(),
            "The workers have 1.4s of work queued, more than this gateway's bound of 1s; retry \
             later."
        );
        assert_eq!(shed.headers(), vec![("retry-after", "1".to_string())]);
        assert_eq!(a.shed.get(), 1);
        drop((first, second, third));
        assert_eq!(a.queued_tokens(), 0);
        assert!(a.admit(Work::default()).is_ok());
    }

    #[test]
    fn work_elsewhere_counts_and_unknown_capacity_admits() {
        let busy = admission(95_000.0, 1000.0, 30.0);
        let e = busy.admit(Work::default()).err().unwrap();
        assert_eq!(e.headers(), vec![("retry-after", "65".to_string())]);
        assert!((busy.queued_seconds() - 95.0).abs() < 1e-9);
        assert!(admission(95_000.0, 0.0, 30.0)
            .admit(Work::default())
            .is_ok());
    }
}
