//! The gateway's Prometheus metrics (the `prometheus` crate, text format 0.0.4). Requests by
//! route and code, their seconds, in-flight requests, per-key requests; per served model its
//! input tokens, tokenize/upstream/hold seconds, chunks per request, retries, ejections, split
//! inputs, cancelled calls, shed and held requests; the worker gauges set at scrape time.
//!
//! In a gateway of several models (`--models-file`) every family of a model, and the request
//! families, carry a `model` label; with one model none does.

use std::sync::Mutex;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, Opts, Registry, TextEncoder,
};

/// Seconds of a request, a tokenization, a worker call.
pub const LATENCY: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Seconds of the gateway's own stages (microseconds to a second).
pub const STAGE_SECONDS: [f64; 15] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0,
];
pub const CHUNKS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
pub const HOLD_SECONDS: [f64; 13] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
];

/// A stage of a request: the body read, decoded and validated, or the answer handed over.
#[derive(Clone, Copy)]
pub enum Stage {
    Parse = 0,
    Respond = 1,
}

/// A served model's figures at scrape time.
pub struct Scrape {
    pub queued_seconds: f64,
    pub delivered: f64,
    pub held: usize,
    pub held_tokens: u64,
}

/// A worker's state at scrape time.
pub struct WorkerState {
    pub address: String,
    pub outstanding_tokens: usize,
    /// "ready", "ejected" or "unready"
    pub state: &'static str,
}

/// The process's metrics: its registry and the families in it.
pub struct Metrics {
    registry: Registry,
    per_model: bool,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    key_requests: IntCounterVec,
    stages: [Histogram; 2],
    pub inflight: IntGauge,
    pub cancelled_requests: IntCounter,
    model: ModelFamilies,
    /// scrapes set, encode and reset the worker gauges one at a time
    scraping: Mutex<()>,
}

/// The families with one child per served model.
struct ModelFamilies {
    input_tokens: IntCounterVec,
    tokenize: HistogramVec,
    upstream: HistogramVec,
    chunks: HistogramVec,
    hold: HistogramVec,
    retries: IntCounterVec,
    ejections: IntCounterVec,
    split_inputs: IntCounterVec,
    cancelled_calls: IntCounterVec,
    shed: IntCounterVec,
    hold_refused: IntCounterVec,
    held: GaugeVec,
    held_tokens: GaugeVec,
    queued_seconds: GaugeVec,
    delivered: GaugeVec,
    outstanding: GaugeVec,
    workers: GaugeVec,
}

/// One served model's children of the model families: no label lookup per observation.
pub struct ModelMetrics {
    name: String,
    pub input_tokens: IntCounter,
    pub tokenize: Histogram,
    pub upstream: Histogram,
    pub chunks: Histogram,
    pub hold: Histogram,
    pub retries: IntCounter,
    pub ejections: IntCounter,
    pub split_inputs: IntCounter,
    pub cancelled_calls: IntCounter,
    pub shed: IntCounter,
    pub hold_full: IntCounter,
    pub hold_timeout: IntCounter,
}

/// The registry in the making: each family registered as it is made.
struct Families<'a> {
    registry: &'a Registry,
    per_model: bool,
}

impl Families<'_> {
    /// `labels`, and `model` last in a gateway of several models.
    fn labels(&self, labels: &[&'static str], by_model: bool) -> Vec<&'static str> {
        let mut all = labels.to_vec();
        if by_model && self.per_model {
            all.push("model");
        }
        all
    }

    fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&'static str],
        by_model: bool,
    ) -> IntCounterVec {
        let family = IntCounterVec::new(Opts::new(name, help), &self.labels(labels, by_model))
            .expect("a valid counter");
        self.registry
            .register(Box::new(family.clone()))
            .expect("a new name");
        family
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&'static str]) -> GaugeVec {
        let family = GaugeVec::new(Opts::new(name, help), &self.labels(labels, true))
            .expect("a valid gauge");
        self.registry
            .register(Box::new(family.clone()))
            .expect("a new name");
        family
    }

    fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&'static str],
        by_model: bool,
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        let family =
            HistogramVec::new(opts, &self.labels(labels, by_model)).expect("a valid histogram");
        self.registry
            .register(Box::new(family.clone()))
            .expect("a new name");
        family
    }
}

impl Metrics {
    /// `per_model`: the gateway serves several models, so model families carry their name.
    pub fn new(per_model: bool) -> Metrics {
        let registry = Registry::new();
        let f = Families {
            registry: &registry,
            per_model,
        };
        let g = "embedfleet_gateway_";
        let stage = f.histogram(
            &format!("{g}stage_seconds"),
            "Time of one request in a gateway stage: parse (body read, JSON decoded, validated) \
             or respond (answer handed to the connection); tokenize and upstream have their own.",
            &STAGE_SECONDS,
            &["stage"],
            false,
        );
        let model = ModelFamilies {
            input_tokens: f.counter(
                &format!("{g}input_tokens_total"),
                "Tokens of accepted requests.",
                &[],
                true,
            ),
            tokenize: f.histogram(
                &format!("{g}tokenize_seconds"),
                "Time tokenizing one request (including the hop to the tokenizer \
             threads).",
                &LATENCY,
                &[],
                true,
            ),
            upstream: f.histogram(
                &format!("{g}upstream_seconds"),
                "Time of one chunk's call to a worker (queueing there plus compute), \
             per attempt.",
                &LATENCY,
                &[],
                true,
            ),
            chunks: f.histogram(
                &format!("{g}chunks_per_request"),
                "Chunks a request was split into.",
                &CHUNKS,
                &[],
                true,
            ),
            hold: f.histogram(
                &format!("{g}hold_seconds"),
                "Time a request waited for a worker to become ready (held requests \
             only).",
                &HOLD_SECONDS,
                &[],
                true,
            ),
            retries: f.counter(
                &format!("{g}retries_total"),
                "Chunks retried on another worker.",
                &[],
                true,
            ),
            ejections: f.counter(
                &format!("{g}worker_ejections_total"),
                "Times a failing worker was taken out of rotation.",
                &[],
                true,
            ),
            split_inputs: f.counter(
                &format!("{g}split_inputs_total"),
                "Inputs over the model's limit embedded as windows (split_long_inputs).",
                &[],
                true,
            ),
            cancelled_calls: f.counter(
                &format!("{g}cancelled_calls_total"),
                "Chunk calls to workers the gateway cancelled: the client went away, or \
             another chunk of the same request failed. A worker may never see one \
             sent just before.",
                &[],
                true,
            ),
            shed: f.counter(
                &format!("{g}shed_requests_total"),
                "Requests answered 429 before tokenization: the work queued ahead was \
             past --max-queue-seconds.",
                &[],
                true,
            ),
            hold_refused: f.counter(
                &format!("{g}hold_refused_total"),
                "Requests answered 503 while waiting for a worker: the hold was full, \
             or timed out.",
                &["reason"],
                false,
            ),
            held: f.gauge(
                &format!("{g}held_requests"),
                "Requests waiting for a worker to become ready (the fleet is at zero or \
             starting).",
                &[],
            ),
            held_tokens: f.gauge(
                &format!("{g}held_tokens"),
                "Tokens of the requests waiting for a worker to become ready.",
                &[],
            ),
            queued_seconds: f.gauge(
                &format!("{g}queued_work_seconds"),
                "Seconds of work queued ahead of a request arriving now, at the usable \
             workers' measured capacity (what admission compares with \
             --max-queue-seconds).",
                &[],
            ),
            delivered: f.gauge(
                &format!("{g}delivered_capacity_ratio"),
                "Tokens/s the fleet answered while this gateway's queue was deep, over \
             the capacity its workers report (1 until learned); admission's \
             capacity is that figure times this.",
                &[],
            ),
            outstanding: f.gauge(
                &format!("{g}worker_outstanding_tokens"),
                "Tokens sent to a worker by this gateway and not yet answered.",
                &["worker"],
            ),
            workers: f.gauge(
                &format!("{g}workers"),
                "Known workers by state (ready: taking traffic; ejected: failing; \
             unready).",
                &["state"],
            ),
        };
        let inflight = IntGauge::new(
            format!("{g}inflight_requests"),
            "Requests being served now.",
        )
        .expect("a valid gauge");
        let cancelled_requests = IntCounter::new(
            format!("{g}cancelled_requests_total"),
            "Requests whose client disconnected before the answer; their chunks \
             were cancelled.",
        )
        .expect("a valid counter");
        for c in [
            Box::new(inflight.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(cancelled_requests.clone()),
        ] {
            registry.register(c).expect("a new name");
        }
        Metrics {
            requests: f.counter(
                &format!("{g}requests_total"),
                "HTTP requests by route and status code.",
                &["route", "code"],
                true,
            ),
            request_seconds: f.histogram(
                &format!("{g}request_seconds"),
                "Time from request start to the response being sent, by route.",
                &LATENCY,
                &["route"],
                true,
            ),
            key_requests: f.counter(
                &format!("{g}key_requests_total"),
                "Authorized requests per API key (only with --api-key-metrics), by \
             route; `key` is the first 12 hex digits of the key's sha256, never the \
             key.",
                &["key", "route"],
                false,
            ),
            stages: [
                stage.with_label_values(&["parse"]),
                stage.with_label_values(&["respond"]),
            ],
            inflight,
            cancelled_requests,
            model,
            per_model,
            scraping: Mutex::new(()),
            registry,
        }
    }

    /// A model's label values after `labels` (its name in a gateway of several).
    fn values<'a>(&self, labels: &[&'a str], model: &'a str) -> Vec<&'a str> {
        let mut all = labels.to_vec();
        if self.per_model {
            all.push(model);
        }
        all
    }

    /// Served model `name`'s children of the model families.
    pub fn model(&self, name: &str) -> ModelMetrics {
        let m = &self.model;
        let one = self.values(&[], name);
        let refused = |reason| m.hold_refused.with_label_values(&[reason]);
        ModelMetrics {
            name: name.to_string(),
            input_tokens: m.input_tokens.with_label_values(&one),
            tokenize: m.tokenize.with_label_values(&one),
            upstream: m.upstream.with_label_values(&one),
            chunks: m.chunks.with_label_values(&one),
            hold: m.hold.with_label_values(&one),
            retries: m.retries.with_label_values(&one),
            ejections: m.ejections.with_label_values(&one),
            split_inputs: m.split_inputs.with_label_values(&one),
            cancelled_calls: m.cancelled_calls.with_label_values(&one),
            shed: m.shed.with_label_values(&one),
            hold_full: refused("full"),
            hold_timeout: refused("timeout"),
        }
    }

    /// One request, with the model that served it ("" when none did: a bad body, an unknown
    /// model, a GET).
    pub fn observe(&self, route: &str, code: u16, model: &str, seconds: f64) {
        let code = code.to_string();
        self.requests
            .with_label_values(&self.values(&[route, &code], model))
            .inc();
        self.request_seconds
            .with_label_values(&self.values(&[route], model))
            .observe(seconds);
    }

    pub fn stage(&self, stage: Stage, seconds: f64) {
        self.stages[stage as usize].observe(seconds);
    }

    /// One authorized request of the key whose label this is.
    pub fn count_key(&self, label: &str, route: &str) {
        self.key_requests.with_label_values(&[label, route]).inc();
    }

    /// The text exposition, with each model's scrape-time figures and workers set first.
    pub fn exposition(&self, models: &[(&ModelMetrics, Scrape, Vec<WorkerState>)]) -> Vec<u8> {
        let _one = self.scraping.lock().expect("scrape lock");
        let m = &self.model;
        // Workers come and go: only the current ones' series are written.
        m.outstanding.reset();
        m.workers.reset();
        for (model, scrape, workers) in models {
            let one = self.values(&[], &model.name);
            let set = |g: &GaugeVec, v: f64| g.with_label_values(&one).set(v);
            set(&m.held, scrape.held as f64);
            set(&m.held_tokens, scrape.held_tokens as f64);
            set(&m.queued_seconds, scrape.queued_seconds);
            set(&m.delivered, scrape.delivered);
            for w in workers {
                let labels = self.values(&[&w.address], &model.name);
                gauge(&m.outstanding, &labels).set(w.outstanding_tokens as f64);
            }
            for state in ["ready", "ejected", "unready"] {
                let n = workers.iter().filter(|w| w.state == state).count();
                gauge(&m.workers, &self.values(&[state], &model.name)).set(n as f64);
            }
        }
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encodes into a Vec");
        out
    }
}

fn gauge(family: &GaugeVec, labels: &[&str]) -> Gauge {
    family.with_label_values(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> Scrape {
        Scrape {
            queued_seconds: 0.0,
            delivered: 1.0,
            held: 0,
            held_tokens: 0,
        }
    }

    fn text(m: &Metrics, models: &[(&ModelMetrics, Scrape, Vec<WorkerState>)]) -> String {
        String::from_utf8(m.exposition(models)).unwrap()
    }

    #[test]
    fn a_shared_gateway_labels_each_model_s_families_and_its_requests() {
        let process = Metrics::new(true);
        let (a, b) = (process.model("a"), process.model("b\"q"));
        process.observe("/v1/embeddings", 200, "a", 0.01);
        process.observe("/v1/embeddings", 404, "", 0.01);
        a.input_tokens.inc_by(7);
        b.hold_full.inc();
        let worker = |state| WorkerState {
            address: "w:1".into(),
            outstanding_tokens: 3,
            state,
        };
        let got = text(
            &process,
            &[
                (&a, idle(), vec![worker("ready")]),
                (&b, idle(), vec![worker("unready")]),
            ],
        );
        for line in [
            "embedfleet_gateway_requests_total{code=\"200\",model=\"a\",route=\"/v1/embeddings\"} \
             1",
            "embedfleet_gateway_requests_total{code=\"404\",model=\"\",route=\"/v1/embeddings\"} \
             1",
            "embedfleet_gateway_request_seconds_count{model=\"a\",route=\"/v1/embeddings\"} \
             1",
            "embedfleet_gateway_input_tokens_total{model=\"a\"} 7",
            "embedfleet_gateway_input_tokens_total{model=\"b\\\"q\"} 0",
            "embedfleet_gateway_tokenize_seconds_count{model=\"a\"} 0",
            "embedfleet_gateway_retries_total{model=\"a\"} 0",
            "embedfleet_gateway_cancelled_requests_total 0",
            "embedfleet_gateway_hold_refused_total{reason=\"full\"} 1",
            "embedfleet_gateway_worker_outstanding_tokens{model=\"a\",worker=\"w:1\"} \
             3",
            "embedfleet_gateway_workers{model=\"a\",state=\"ready\"} 1",
            "embedfleet_gateway_workers{model=\"b\\\"q\",state=\"unready\"} 1",
            "embedfleet_gateway_inflight_requests 0",
        ] {
            assert!(got.contains(&format!("{line}\n")), "{line}\n{got}");
        }
    }

    #[test]
    fn one_model_has_no_model_label_and_buckets_are_cumulative() {
        let m = Metrics::new(false);
        let one = m.model("m");
        m.observe("/v1/embeddings", 200, "m", 0.002);
        m.observe("/v1/embeddings", 200, "m", 0.2);
        m.observe("/v1/embeddings", 400, "m", 100.0);
        m.stage(Stage::Parse, 0.00003);
        let got = text(&m, &[(&one, idle(), Vec::new())]);
        for line in [
            "embedfleet_gateway_requests_total{code=\"200\",route=\"/v1/embeddings\"} \
             2",
            "embedfleet_gateway_request_seconds_bucket{route=\"/v1/embeddings\",le=\"0.0025\"} \
             1",
            "embedfleet_gateway_request_seconds_bucket{route=\"/v1/embeddings\",le=\"30\"} \
             2",
            "embedfleet_gateway_request_seconds_bucket{route=\"/v1/embeddings\",le=\"+Inf\"} \
             3",
            "embedfleet_gateway_stage_seconds_bucket{stage=\"parse\",le=\"0.00005\"} \
             1",
            "embedfleet_gateway_input_tokens_total 0",
            "embedfleet_gateway_held_requests 0",
        ] {
            assert!(got.contains(&format!("{line}\n")), "{line}\n{got}");
        }
    }

    #[test]
    fn removed_workers_leave_the_gauges() {
        let m = Metrics::new(false);
        let one = m.model("m");
        let w = WorkerState {
            address: "w:1".into(),
            outstanding_tokens: 0,
            state: "ready",
        };
        assert!(text(&m, &[(&one, idle(), vec![w])]).contains("worker=\"w:1\""));
        assert!(!text(&m, &[(&one, idle(), Vec::new())]).contains("worker=\"w:1\""));
    }

    #[test]
    fn key_requests_are_counted_by_label_and_route() {
        let m = Metrics::new(false);
        m.count_key("ba7816bf8f01", "/v1/embeddings");
        m.count_key("ba7816bf8f01", "/v1/embeddings");
        let got = text(&m, &[]);
        assert!(got.contains(
            "embedfleet_gateway_key_requests_total{key=\"ba7816bf8f01\",route=\"/v1/embeddings\"} \
             2"
        ));
    }
}
