//! The Python gateway's metrics under the same names and labels, in Prometheus text: requests
//! (embedfleet_gateway_requests_total{route,code}, embedfleet_gateway_request_seconds{route},
//! embedfleet_gateway_inflight_requests, embedfleet_gateway_input_tokens_total and, with
//! --api-key-metrics, embedfleet_gateway_key_requests_total{key,route}), the tokenize, upstream,
//! chunks-per-request and stage (parse, respond) histograms, retries, ejections, split inputs, and the worker gauges
//! read at scrape time. Hand-written: a dozen families do not need a client library's registry,
//! locks and label hashing per request.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The Python gateway's request-duration buckets (metrics.py _LATENCY).
pub const LATENCY: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The Python gateway's stage buckets (metrics.py _STAGE_SECONDS).
pub const STAGE_SECONDS: [f64; 15] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0,
];

/// The gateway's own stages of a request (metrics.py STAGES): parse (the body read, decoded
/// and validated), respond (the answer sent), by index in `Metrics::stages`.
pub const PARSE: usize = 0;
pub const RESPOND: usize = 1;
const STAGES: [&str; 2] = ["parse", "respond"];

/// The Python gateway's chunks-per-request buckets.
pub const CHUNKS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

#[derive(Default, Clone)]
struct Histogram {
    /// per bucket (no family has more than LATENCY's)
    counts: [u64; LATENCY.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    /// Each sample lands in its first bucket here; buckets are cumulative at exposition.
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if let Some(i) = bounds.iter().position(|&b| value <= b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += value;
    }

    /// `name`'s bucket, count and sum lines; `labels` ("route=\"/x\"," or "") come first.
    fn write(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let mut cumulative = 0;
        for (i, bound) in bounds.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}le=\"{}\"}} {}",
                number(*bound),
                number(cumulative as f64)
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}le=\"+Inf\"}} {}",
            number(self.count as f64)
        );
        // As prometheus_client writes them: no braces without labels, the sum as a float.
        let bare = labels.trim_end_matches(',');
        let braced = if bare.is_empty() {
            String::new()
        } else {
            format!("{{{bare}}}")
        };
        let _ = writeln!(out, "{name}_count{braced} {}", number(self.count as f64));
        let _ = writeln!(out, "{name}_sum{braced} {}", number(self.sum));
    }
}

/// Admission's and the hold's figures at scrape time: requests shed, seconds of work queued
/// ahead, the delivered-capacity ratio; requests held waiting for a worker, and their tokens.
pub struct Scrape {
    pub shed: u64,
    pub queued_seconds: f64,
    pub delivered: f64,
    pub held: usize,
    pub held_tokens: u64,
}

impl Scrape {
    pub fn of(a: &crate::admission::Admission, h: &crate::hold::Hold) -> Self {
        Scrape {
            shed: a.shed.load(Ordering::Relaxed),
            queued_seconds: a.queued_seconds(),
            delivered: a.delivered(),
            held: h.held.load(Ordering::Relaxed),
            held_tokens: h.held_tokens.load(Ordering::Relaxed),
        }
    }
}

/// A worker's state at scrape time, for the worker gauges.
pub struct WorkerState {
    pub address: String,
    pub outstanding_tokens: usize,
    /// "ready", "ejected" or "unready", as the Python gateway counts them
    pub state: &'static str,
}

#[derive(Default)]
struct Requests {
    /// by (route, code, served model: "" when none served it)
    counts: BTreeMap<(&'static str, u16, &'static str), u64>,
    seconds: BTreeMap<(&'static str, &'static str), Histogram>,
}

/// One gateway's metrics, or one model's part of them. In a gateway of several models
/// (`--models-file`), the process's (`Metrics::shared`) hold the request families, labelled by
/// model, and the stages, keys, in-flight and cancelled requests; each model's
/// (`Metrics::for_model`) hold the rest (the Python gateway's MODEL_LABELLED), labelled by its
/// name. With one model, one `Metrics` holds all of it, and no family has a model label.
#[derive(Default)]
pub struct Metrics {
    /// `model="name",` on a model's families in a gateway of several, else ""
    label: String,
    /// whether the request families carry the model label
    per_model: bool,
    requests: Mutex<Requests>,
    keys: Mutex<BTreeMap<(Arc<str>, &'static str), u64>>,
    /// one request's tokenization; one chunk call's attempt; chunks a request went out in
    histograms: Mutex<[Histogram; 4]>,
    /// the parse and respond stages of requests
    stages: Mutex<[Histogram; STAGES.len()]>,
    /// requests the hold refused: full, timeout
    hold_refused: [AtomicU64; 2],
    pub input_tokens: AtomicU64,
    pub inflight: AtomicI64,
    pub retries: AtomicU64,
    pub ejections: AtomicU64,
    pub split_inputs: AtomicU64,
    /// POSTs whose client left before the answer, and chunk calls dropped in flight
    pub cancelled: AtomicU64,
    pub cancelled_calls: AtomicU64,
}

/// One model's metrics and its figures at scrape time, for the exposition.
pub struct Part<'a> {
    pub metrics: &'a Metrics,
    pub workers: Vec<WorkerState>,
    pub scrape: Scrape,
}

/// A label value as the text format needs it: backslash, quote and newline escaped.
fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `{a="1",b="2"}` of the non-empty label parts (each `k="v"`, with or without a trailing
/// comma), or nothing when all are empty.
fn braces(parts: &[&str]) -> String {
    let inner: Vec<&str> = parts
        .iter()
        .map(|p| p.trim_end_matches(','))
        .filter(|p| !p.is_empty())
        .collect();
    if inner.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", inner.join(","))
    }
}

const TOKENIZE: usize = 0;
const UPSTREAM: usize = 1;
const CHUNKS_PER_REQUEST: usize = 2;
const HOLD: usize = 3;

/// The Python gateway's hold-seconds buckets.
pub const HOLD_SECONDS: [f64; 13] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
];

/// The families besides the request ones: (index in `stages`, name, help, bounds).
const HISTOGRAMS: [(usize, &str, &str, &[f64]); 4] = [
    (
        TOKENIZE,
        "embedfleet_gateway_tokenize_seconds",
        "Time tokenizing one request (including the hop to the tokenizer threads).",
        &LATENCY,
    ),
    (
        UPSTREAM,
        "embedfleet_gateway_upstream_seconds",
        "Time of one chunk's call to a worker (queueing there plus compute), per attempt.",
        &LATENCY,
    ),
    (
        CHUNKS_PER_REQUEST,
        "embedfleet_gateway_chunks_per_request",
        "Chunks a request was split into.",
        &CHUNKS,
    ),
    (
        HOLD,
        "embedfleet_gateway_hold_seconds",
        "Time a request waited for a worker to become ready (held requests only).",
        &HOLD_SECONDS,
    ),
];

/// Python's float repr for the values these families hold (prometheus_client writes floats),
/// so bucket bounds are the same label values: 1.0, 0.25, 1e-05.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else if v.abs() < 1e-4 {
        let text = format!("{v:e}"); // "2.5e-5"
        let (mantissa, exponent) = text.split_once('e').expect("an exponent");
        let exponent: i32 = exponent.parse().expect("a number");
        format!("{mantissa}e-{:02}", -exponent)
    } else {
        format!("{v}")
    }
}

impl Metrics {
    /// A gateway of several models' own metrics: its request families carry a model label.
    pub fn shared() -> Metrics {
        Metrics {
            per_model: true,
            ..Metrics::default()
        }
    }

    /// Model `name`'s part of a gateway of several models: its families carry `model=name`.
    pub fn for_model(name: &str) -> Metrics {
        Metrics {
            label: format!("model=\"{}\",", escaped(name)),
            ..Metrics::default()
        }
    }

    /// One request, with the model that served it ("" when none did: a bad body, an unknown
    /// model, a GET); the model is a label only in a gateway of several.
    pub fn observe(&self, route: &'static str, code: u16, model: &'static str, seconds: f64) {
        let model = if self.per_model { model } else { "" };
        let mut r = self.requests.lock().expect("metrics lock");
        *r.counts.entry((route, code, model)).or_default() += 1;
        r.seconds
            .entry((route, model))
            .or_default()
            .observe(&LATENCY, seconds);
    }

    fn histogram(&self, which: usize, value: f64) {
        self.histograms.lock().expect("metrics lock")[which].observe(HISTOGRAMS[which].3, value);
    }

    /// One request's time in stage `which` (PARSE or RESPOND).
    pub fn stage(&self, which: usize, seconds: f64) {
        self.stages.lock().expect("metrics lock")[which].observe(&STAGE_SECONDS, seconds);
    }

    pub fn tokenized(&self, seconds: f64) {
        self.histogram(TOKENIZE, seconds);
    }

    pub fn upstream(&self, seconds: f64) {
        self.histogram(UPSTREAM, seconds);
    }

    /// A held request's wait, however it ended.
    pub fn held(&self, seconds: f64) {
        self.histogram(HOLD, seconds);
    }

    /// A request the hold answered 503: `reason` "full" or "timeout".
    pub fn hold_refused(&self, reason: &str) {
        let which = usize::from(reason != "full");
        self.hold_refused[which].fetch_add(1, Ordering::Relaxed);
    }

    pub fn chunks(&self, chunks: usize) {
        self.histogram(CHUNKS_PER_REQUEST, chunks as f64);
    }

    /// One authorized request of the key whose label this is.
    pub fn count_key(&self, label: Arc<str>, route: &'static str) {
        *self
            .keys
            .lock()
            .expect("metrics lock")
            .entry((label, route))
            .or_default() += 1;
    }

    /// The text exposition of the process's families (`self`) and of each model's (`parts`;
    /// with one model, `self` is that model's too).
    pub fn exposition(&self, parts: &[Part]) -> String {
        let keys = self.keys.lock().expect("metrics lock").clone();
        let (counts, seconds) = {
            let r = self.requests.lock().expect("metrics lock");
            (r.counts.clone(), r.seconds.clone())
        };
        let model_label = |model: &str| {
            if self.per_model {
                format!("model=\"{}\",", escaped(model))
            } else {
                String::new()
            }
        };
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP embedfleet_gateway_requests_total HTTP requests by route and status code.\n",
        );
        out.push_str("# TYPE embedfleet_gateway_requests_total counter\n");
        for ((route, code, model), n) in &counts {
            let labels = braces(&[
                &format!("route=\"{route}\",code=\"{code}\""),
                &model_label(model),
            ]);
            let _ = writeln!(
                out,
                "embedfleet_gateway_requests_total{labels} {}",
                number(*n as f64)
            );
        }
        out.push_str("# HELP embedfleet_gateway_request_seconds Time from request start to the response being sent, by route.\n");
        out.push_str("# TYPE embedfleet_gateway_request_seconds histogram\n");
        for ((route, model), h) in &seconds {
            let labels = format!("route=\"{route}\",{}", model_label(model));
            h.write(
                &mut out,
                "embedfleet_gateway_request_seconds",
                &labels,
                &LATENCY,
            );
        }
        out.push_str(
            "# HELP embedfleet_gateway_key_requests_total Authorized requests per API key (only \
             with --api-key-metrics), by route; `key` is the first 12 hex digits of the key's \
             sha256, never the key.\n",
        );
        out.push_str("# TYPE embedfleet_gateway_key_requests_total counter\n");
        for ((key, route), n) in &keys {
            let _ = writeln!(
                out,
                "embedfleet_gateway_key_requests_total{{key=\"{key}\",route=\"{route}\"}} {}",
                number(*n as f64)
            );
        }
        out.push_str("# HELP embedfleet_gateway_input_tokens_total Tokens of accepted requests.\n");
        out.push_str("# TYPE embedfleet_gateway_input_tokens_total counter\n");
        for p in parts {
            let _ = writeln!(
                out,
                "embedfleet_gateway_input_tokens_total{} {}",
                braces(&[&p.metrics.label]),
                number(p.metrics.input_tokens.load(Ordering::Relaxed) as f64)
            );
        }
        let histograms: Vec<_> = parts
            .iter()
            .map(|p| p.metrics.histograms.lock().expect("metrics lock").clone())
            .collect();
        for (which, name, help, bounds) in HISTOGRAMS {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (p, h) in parts.iter().zip(&histograms) {
                h[which].write(&mut out, name, &p.metrics.label, bounds);
            }
        }
        let stages = self.stages.lock().expect("metrics lock").clone();
        let name = "embedfleet_gateway_stage_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time of one request in a gateway stage: parse (body read, JSON \
             decoded, validated) or respond (answer JSON-encoded and sent); tokenize and upstream \
             have their own.\n# TYPE {name} histogram"
        );
        for (stage, h) in STAGES.iter().zip(&stages) {
            h.write(
                &mut out,
                name,
                &format!("stage=\"{stage}\","),
                &STAGE_SECONDS,
            );
        }
        type Counted = fn(&Metrics) -> &AtomicU64;
        let counters: [(&str, &str, bool, Counted); 5] = [
            (
                "embedfleet_gateway_retries_total",
                "Chunks retried on another worker.",
                true,
                |m| &m.retries,
            ),
            (
                "embedfleet_gateway_worker_ejections_total",
                "Times a failing worker was taken out of rotation.",
                true,
                |m| &m.ejections,
            ),
            (
                "embedfleet_gateway_split_inputs_total",
                "Inputs over the model's limit embedded as windows (split_long_inputs).",
                true,
                |m| &m.split_inputs,
            ),
            (
                "embedfleet_gateway_cancelled_requests_total",
                "Requests whose client disconnected before the answer; their chunks were \
                 cancelled.",
                false,
                |m| &m.cancelled,
            ),
            (
                "embedfleet_gateway_cancelled_calls_total",
                "Chunk calls to workers the gateway cancelled: the client went away, or another \
                 chunk of the same request failed. A worker may never see one sent just before.",
                true,
                |m| &m.cancelled_calls,
            ),
        ];
        for (name, help, per_model, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let mut write = |m: &Metrics| {
                let n = value(m).load(Ordering::Relaxed) as f64;
                let _ = writeln!(out, "{name}{} {}", braces(&[&m.label]), number(n));
            };
            if per_model {
                parts.iter().for_each(|p| write(p.metrics));
            } else {
                write(self);
            }
        }
        out.push_str(
            "# HELP embedfleet_gateway_shed_requests_total Requests answered 429 before \
             tokenization: the work queued ahead was past --max-queue-seconds.\n\
             # TYPE embedfleet_gateway_shed_requests_total counter\n",
        );
        for p in parts {
            let _ = writeln!(
                out,
                "embedfleet_gateway_shed_requests_total{} {}",
                braces(&[&p.metrics.label]),
                number(p.scrape.shed as f64)
            );
        }
        out.push_str(
            "# HELP embedfleet_gateway_hold_refused_total Requests answered 503 while waiting \
             for a worker: the hold was full, or timed out.\n\
             # TYPE embedfleet_gateway_hold_refused_total counter\n",
        );
        for (which, reason) in ["full", "timeout"].iter().enumerate() {
            // One family for the process, as the Python gateway's: every model's holds count.
            let n: u64 = parts
                .iter()
                .map(|p| p.metrics.hold_refused[which].load(Ordering::Relaxed))
                .sum();
            if n > 0 {
                // A labelled counter shows its children once used, as prometheus_client's.
                let _ = writeln!(
                    out,
                    "embedfleet_gateway_hold_refused_total{{reason=\"{reason}\"}} {}",
                    number(n as f64)
                );
            }
        }
        type Gauged = fn(&Scrape) -> f64;
        let gauges: [(&str, &str, Gauged); 4] = [
            (
                "embedfleet_gateway_held_requests",
                "Requests waiting for a worker to become ready (the fleet is at zero or \
                 starting).",
                |s| s.held as f64,
            ),
            (
                "embedfleet_gateway_held_tokens",
                "Tokens of the requests waiting for a worker to become ready.",
                |s| s.held_tokens as f64,
            ),
            (
                "embedfleet_gateway_queued_work_seconds",
                "Seconds of work queued ahead of a request arriving now, at the usable workers' \
                 measured capacity (what admission compares with --max-queue-seconds).",
                |s| s.queued_seconds,
            ),
            (
                "embedfleet_gateway_delivered_capacity_ratio",
                "Tokens/s the fleet answered while this gateway's queue was deep, over the \
                 capacity its workers report (1 until learned); admission's capacity is that \
                 figure times this.",
                |s| s.delivered,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for p in parts {
                let labels = braces(&[&p.metrics.label]);
                let _ = writeln!(out, "{name}{labels} {}", number(value(&p.scrape)));
            }
        }
        out.push_str(
            "# HELP embedfleet_gateway_worker_outstanding_tokens Tokens sent to a worker by this \
             gateway and not yet answered.\n\
             # TYPE embedfleet_gateway_worker_outstanding_tokens gauge\n",
        );
        for p in parts {
            for w in &p.workers {
                let labels = braces(&[&format!("worker=\"{}\"", w.address), &p.metrics.label]);
                let _ = writeln!(
                    out,
                    "embedfleet_gateway_worker_outstanding_tokens{labels} {}",
                    number(w.outstanding_tokens as f64)
                );
            }
        }
        out.push_str(
            "# HELP embedfleet_gateway_workers Known workers by state (ready: taking traffic; \
             ejected: failing; unready).\n# TYPE embedfleet_gateway_workers gauge\n",
        );
        for p in parts {
            for state in ["ready", "ejected", "unready"] {
                let n = p.workers.iter().filter(|w| w.state == state).count();
                let labels = braces(&[&format!("state=\"{state}\""), &p.metrics.label]);
                let _ = writeln!(
                    out,
                    "embedfleet_gateway_workers{labels} {}",
                    number(n as f64)
                );
            }
        }
        out.push_str("# HELP embedfleet_gateway_inflight_requests Requests being served now.\n");
        out.push_str("# TYPE embedfleet_gateway_inflight_requests gauge\n");
        let _ = writeln!(
            out,
            "embedfleet_gateway_inflight_requests {}",
            number(self.inflight.load(Ordering::Relaxed) as f64)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Scrape = Scrape {
        shed: 0,
        queued_seconds: 0.0,
        delivered: 1.0,
        held: 0,
        held_tokens: 0,
    };

    fn alone(m: &Metrics) -> String {
        m.exposition(&[Part {
            metrics: m,
            workers: Vec::new(),
            scrape: IDLE,
        }])
    }

    #[test]
    fn a_shared_gateway_labels_each_model_s_families_and_its_requests() {
        let process = Metrics::shared();
        let (a, b) = (Metrics::for_model("a"), Metrics::for_model("b\"q"));
        process.observe("/v1/embeddings", 200, "a", 0.01);
        process.observe("/v1/embeddings", 404, "", 0.01);
        a.input_tokens.fetch_add(7, Ordering::Relaxed);
        b.hold_refused("full");
        let worker = |state| WorkerState {
            address: "w:1".into(),
            outstanding_tokens: 3,
            state,
        };
        let text = process.exposition(&[
            Part {
                metrics: &a,
                workers: vec![worker("ready")],
                scrape: IDLE,
            },
            Part {
                metrics: &b,
                workers: vec![worker("unready")],
                scrape: IDLE,
            },
        ]);
        for line in [
            "embedfleet_gateway_requests_total{route=\"/v1/embeddings\",code=\"200\",model=\"a\"} 1.0",
            "embedfleet_gateway_requests_total{route=\"/v1/embeddings\",code=\"404\",model=\"\"} 1.0",
            "embedfleet_gateway_request_seconds_count{route=\"/v1/embeddings\",model=\"a\"} 1.0",
            "embedfleet_gateway_input_tokens_total{model=\"a\"} 7.0",
            "embedfleet_gateway_input_tokens_total{model=\"b\\\"q\"} 0.0",
            "embedfleet_gateway_tokenize_seconds_count{model=\"a\"} 0.0",
            "embedfleet_gateway_retries_total{model=\"a\"} 0.0",
            "embedfleet_gateway_cancelled_requests_total 0.0",
            "embedfleet_gateway_hold_refused_total{reason=\"full\"} 1.0",
            "embedfleet_gateway_worker_outstanding_tokens{worker=\"w:1\",model=\"a\"} 3.0",
            "embedfleet_gateway_workers{state=\"ready\",model=\"a\"} 1.0",
            "embedfleet_gateway_workers{state=\"unready\",model=\"b\\\"q\"} 1.0",
            "embedfleet_gateway_inflight_requests 0.0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        }
    }

    #[test]
    fn buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe("/v1/embeddings", 200, "", 0.002);
        m.observe("/v1/embeddings", 200, "", 0.2);
        m.observe("/v1/embeddings", 400, "", 100.0);
        let text = alone(&m);
        assert!(text.contains(
            "embedfleet_gateway_requests_total{route=\"/v1/embeddings\",code=\"200\"} 2.0"
        ));
        assert!(text.contains("_bucket{route=\"/v1/embeddings\",le=\"0.0025\"} 1.0"));
        assert!(text.contains("_bucket{route=\"/v1/embeddings\",le=\"0.25\"} 2.0"));
        assert!(text.contains("_bucket{route=\"/v1/embeddings\",le=\"30.0\"} 2.0"));
        assert!(text.contains("_bucket{route=\"/v1/embeddings\",le=\"+Inf\"} 3.0"));
    }

    #[test]
    fn stages_are_labelled_with_python_s_bounds() {
        let m = Metrics::default();
        m.stage(PARSE, 0.00003);
        let text = alone(&m);
        let name = "embedfleet_gateway_stage_seconds";
        assert!(text.contains(&format!(
            "{name}_bucket{{stage=\"parse\",le=\"2.5e-05\"}} 0.0"
        )));
        assert!(text.contains(&format!(
            "{name}_bucket{{stage=\"parse\",le=\"5e-05\"}} 1.0"
        )));
        assert!(text.contains(&format!(
            "{name}_bucket{{stage=\"parse\",le=\"0.0001\"}} 1.0"
        )));
        assert!(text.contains(&format!("{name}_count{{stage=\"respond\"}} 0.0")));
        assert_eq!(number(1e-5), "1e-05");
        assert_eq!(number(0.00025), "0.00025");
    }

    #[test]
    fn key_requests_are_counted_by_label_and_route() {
        let m = Metrics::default();
        let label: Arc<str> = Arc::from("ba7816bf8f01");
        m.count_key(Arc::clone(&label), "/v1/embeddings");
        m.count_key(label, "/v1/embeddings");
        let text = alone(&m);
        assert!(text.contains(
            "embedfleet_gateway_key_requests_total{key=\"ba7816bf8f01\",route=\"/v1/embeddings\"} 2.0"
        ));
    }
}
