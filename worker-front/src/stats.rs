//! What the front counts for /metrics, which the Python side serves (embedfleet.worker.
//! front_metrics) under the Python front's names: each call's outcome by method and status
//! code, its time in the server (a histogram on bounds the Python side gives), the requests
//! dropped unrun by reason, the EmbedStreams open and whether it listens. Atomics only: a call
//! costs a few relaxed adds, and the Python side reads them at scrape time.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;

/// The methods counted (requests_total's `rpc` label): the engine's, EmbedStream's own
/// refusals (its calls count as Embed) and Info.
pub const METHODS: [&str; 8] = [
    "Embed",
    "Score",
    "Classify",
    "SparseEmbed",
    "MultiVectorEmbed",
    "HybridEmbed",
    "EmbedStream",
    "Info",
];
/// gRPC's status codes, OK (0) to UNAUTHENTICATED (16).
const CODES: usize = 17;

pub struct Stats {
    /// By method then code: METHODS.len() x CODES.
    requests: Vec<AtomicU64>,
    /// Upper bounds of the request-time buckets, in seconds; one more bucket counts the rest.
    bounds: Vec<f64>,
    buckets: Vec<AtomicU64>,
    nanos: AtomicU64,
    cancelled: AtomicU64,
    deadline: AtomicU64,
    streams: AtomicI64,
    listening: AtomicBool,
    /// Requests admitted to the queue (capacity probes aside): a background measurement yields
    /// when it moves.
    arrivals: AtomicU64,
    /// The capacity measured, tokens/s as f64 bits (0: unmeasured), for Info.
    capacity: AtomicU64,
    /// Tokens/s of the latest saturated batches as f64 bits (0: none seen yet; throughput.rs).
    saturated: AtomicU64,
}

/// The counters as read at one moment (each one consistent, not the set).
pub struct Snapshot {
    /// (method, code, count) for each pair seen.
    pub requests: Vec<(&'static str, i32, u64)>,
    /// Calls per request-time bucket (not cumulative), the last one past every bound.
    pub buckets: Vec<u64>,
    pub seconds: f64,
    pub dropped_cancelled: u64,
    pub dropped_deadline: u64,
    pub streams: i64,
    pub listening: bool,
}

impl Stats {
    pub fn new(mut bounds: Vec<f64>) -> Self {
        bounds.retain(|b| b.is_finite());
        Stats {
            requests: (0..METHODS.len() * CODES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds,
            nanos: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            streams: AtomicI64::new(0),
            listening: AtomicBool::new(false),
            arrivals: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            saturated: AtomicU64::new(0),
        }
    }

    /// One call answered: `method` one of METHODS, its time observed when given.
    pub fn record(&self, method: &str, code: Code, took: Option<Duration>) {
        let Some(at) = METHODS.iter().position(|m| *m == method) else {
            return;
        };
        let code = usize::try_from(code as i32).unwrap_or(0).min(CODES - 1);
        self.requests[at * CODES + code].fetch_add(1, Ordering::Relaxed);
        if let Some(took) = took {
            let seconds = took.as_secs_f64();
            let bucket = self.bounds.partition_point(|bound| *bound < seconds);
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
            let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            self.nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// A call counted when this is dropped: with the code set by then, else CANCELLED (a
    /// handler dropped half-way is a call its client left).
    pub fn counting<'a>(&'a self, method: &'static str) -> Counting<'a> {
        Counting {
            stats: self,
            method,
            started: Instant::now(),
            code: Code::Cancelled,
        }
    }

    /// A queued request dropped unrun, by its status (CANCELLED or DEADLINE_EXCEEDED).
    pub fn dropped(&self, code: Code) {
        let counter = match code {
            Code::DeadlineExceeded => &self.deadline,
            _ => &self.cancelled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// An EmbedStream opened, held open until the guard drops.
    pub fn stream_opened(self: &std::sync::Arc<Self>) -> OpenStream {
        self.streams.fetch_add(1, Ordering::Relaxed);
        OpenStream(std::sync::Arc::clone(self))
    }

    pub fn arrived(&self) {
        self.arrivals.fetch_add(1, Ordering::Relaxed);
    }

    pub fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }

    pub fn set_capacity(&self, tokens_per_second: f64) {
        self.capacity
            .store(tokens_per_second.to_bits(), Ordering::Relaxed);
    }

    pub fn capacity(&self) -> f64 {
        f64::from_bits(self.capacity.load(Ordering::Relaxed))
    }

    pub fn set_saturated(&self, tokens_per_second: f64) {
        self.saturated
            .store(tokens_per_second.to_bits(), Ordering::Relaxed);
    }

    pub fn saturated(&self) -> f64 {
        f64::from_bits(self.saturated.load(Ordering::Relaxed))
    }

    pub fn set_listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    pub fn snapshot(&self) -> Snapshot {
        let requests = self
            .requests
            .iter()
            .enumerate()
            .filter_map(|(at, count)| {
                let count = count.load(Ordering::Relaxed);
                let code = i32::try_from(at % CODES).unwrap_or(0);
                (count > 0).then_some((METHODS[at / CODES], code, count))
            })
            .collect();
        Snapshot {
            requests,
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            dropped_cancelled: self.cancelled.load(Ordering::Relaxed),
            dropped_deadline: self.deadline.load(Ordering::Relaxed),
            streams: self.streams.load(Ordering::Relaxed),
            listening: self.listening.load(Ordering::Acquire),
        }
    }
}

pub struct Counting<'a> {
    stats: &'a Stats,
    method: &'static str,
    started: Instant,
    pub code: Code,
}

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        self.stats.record(self.method, self.code, Some(took));
    }
}

/// One open EmbedStream in the count, until dropped with the stream's replies.
pub struct OpenStream(std::sync::Arc<Stats>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}
