//! embedfleet's worker front in Rust (issue 38): the gRPC server, the FCFS token-budget queue
//! and the byte budget, hosting the Python engine in-process. Python builds and warms the
//! engine (embedfleet.worker.rust_front), then calls `Server.serve`, which holds its thread
//! until the drain is done; one Rust thread computes batches through a Python callable, and
//! the Python side's /metrics reads `Server.stats` at scrape time.
use std::sync::Arc;

use prost::Message;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod codec;
mod connections;
mod engine;
mod limits;
mod queue;
mod server;
mod service;
mod stats;
mod throughput;
mod wire;

/// The protocol's messages (embedfleet.proto).
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("embedfleet.v1");
}

/// The Worker service's server side (build.rs lists its methods).
#[allow(clippy::all, clippy::pedantic)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/embedfleet.v1.Worker.rs"));
}

/// The front of one worker: built with its budgets (`Server(...)`), then `serve` holds the
/// calling thread until the drain is done, while `stats` may be read from any other thread.
#[pyclass(frozen, name = "Server")]
struct PyServer {
    queue: Arc<queue::Queue>,
    limits: Arc<limits::Limits>,
    stats: Arc<stats::Stats>,
    /// `stop`'s signal to the serving thread: drain as on SIGTERM.
    stop: Arc<tokio::sync::Notify>,
}

#[pymethods]
impl PyServer {
    /// `request_seconds_buckets`: the upper bounds (seconds) of the request-time histogram.
    #[new]
    #[pyo3(signature = (*, max_batch_tokens, max_batch_sequences, hard_max_tokens,
        max_queue_requests, max_inflight_bytes, request_seconds_buckets))]
    fn new(
        max_batch_tokens: usize,
        max_batch_sequences: usize,
        hard_max_tokens: usize,
        max_queue_requests: usize,
        max_inflight_bytes: usize,
        request_seconds_buckets: Vec<f64>,
    ) -> Self {
        let budget = queue::Budget {
            max_tokens: max_batch_tokens,
            max_sequences: max_batch_sequences,
            hard_max_tokens,
        };
        PyServer {
            queue: Arc::new(queue::Queue::new(budget, max_queue_requests)),
            limits: limits::Limits::new(max_inflight_bytes),
            stats: Arc::new(stats::Stats::new(request_seconds_buckets)),
            stop: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Serve the Worker service and grpc.health.v1 on `host:port` until SIGTERM, SIGINT or
    /// `stop`, and the drain. `batches.launch(list[(method, bytes, queue_wait, trace context or
    /// None)])` launches a batch of serialized requests; its `ready()` and `finish() ->
    /// list[bytes | (code, message)]` (engine.rs). `info` is the serialized InfoResponse's
    /// fixed part; `on_listening(port)` is called once bound; `traced`: unary calls carry
    /// their trace context. The GIL is released throughout.
    #[pyo3(signature = (*, host, port, max_message_bytes, drain_seconds, info, batches,
        on_listening, log_level = "info", json_logs = true, traced = false))]
    #[allow(clippy::too_many_arguments)] // keyword-only: each one named at the Python call
    fn serve(
        &self,
        py: Python<'_>,
        host: String,
        port: u16,
        max_message_bytes: usize,
        drain_seconds: f64,
        info: &[u8],
        batches: Py<PyAny>,
        on_listening: Py<PyAny>,
        log_level: &str,
        json_logs: bool,
        traced: bool,
    ) -> PyResult<()> {
        init_logs(log_level, json_logs);
        let info = pb::InfoResponse::decode(info)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let engine = {
            let queue = Arc::clone(&self.queue);
            let stats = Arc::clone(&self.stats);
            std::thread::Builder::new()
                .name("engine".into())
                .spawn(move || engine::run(queue, stats, batches))?
        };
        let config = server::Config {
            host,
            port,
            max_message_bytes,
            drain_seconds,
            traced,
        };
        let served = py.allow_threads(|| {
            let parts = server::Parts {
                queue: Arc::clone(&self.queue),
                limits: Arc::clone(&self.limits),
                stats: Arc::clone(&self.stats),
                info,
                on_listening,
                stop: Arc::clone(&self.stop),
            };
            let served = server::run(config, parts);
            // Whatever ended serving, the engine thread answers what is queued and ends.
            self.queue.stop();
            let _ = engine.join();
            served
        });
        tracing::info!("stopped");
        served
    }

    /// Drain and return from `serve` as on SIGTERM, from any thread: the Python side's way
    /// out when the device is lost (it then exits non-zero). Before `serve`, it drains at once.
    fn stop(&self) {
        self.stop.notify_one();
    }

    /// Queue capacity-measurement work (embedfleet.worker.rust_capacity): `id`'s item, of
    /// `tokens` in `sequences`, reaches `batches.launch` as a ("Probe", id as 8 little-endian
    /// bytes, queue_wait) call in its turn. False when the queue is full or the worker drains.
    fn probe(&self, id: u64, tokens: usize, sequences: usize) -> bool {
        if self.limits.draining() {
            return false;
        }
        let entry = queue::Entry {
            rpc: queue::Rpc::Probe,
            tokens,
            sequences,
            deadline: None,
            arrived: std::time::Instant::now(),
            payload: bytes::Bytes::copy_from_slice(&id.to_le_bytes()),
            reply: queue::Reply::Probe,
            trace: None,
            held: None,
        };
        self.queue.push(entry).is_ok()
    }

    /// Requests admitted so far (probes aside): a measurement yields when this moves.
    fn arrivals(&self) -> u64 {
        self.stats.arrivals()
    }

    /// The capacity measured (Info reports it) and the batch token budget it paces.
    fn publish(&self, capacity_tokens_per_second: f64, max_batch_tokens: usize) {
        self.stats.set_capacity(capacity_tokens_per_second);
        self.queue.set_max_tokens(max_batch_tokens);
    }

    /// What /metrics reads at scrape time (embedfleet.worker.front_metrics): a dict of the
    /// live figures (queued_requests, queued_tokens, inflight, inflight_bytes, streams,
    /// listening, draining, saturated_tokens_per_second) and the counters (requests:
    /// [(method, code, count)], request_seconds_buckets: calls per bucket, not cumulative, the last past every bound;
    /// request_seconds_sum; dropped_cancelled; dropped_deadline).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.stats.snapshot();
        let (queued_requests, queued_tokens) = self.queue.queued();
        let stats = PyDict::new(py);
        stats.set_item("queued_requests", queued_requests)?;
        stats.set_item("queued_tokens", queued_tokens)?;
        stats.set_item("inflight", self.limits.inflight())?;
        stats.set_item("inflight_bytes", self.limits.held())?;
        stats.set_item("streams", snapshot.streams)?;
        stats.set_item("listening", snapshot.listening)?;
        stats.set_item("draining", self.limits.draining())?;
        stats.set_item("requests", snapshot.requests)?;
        stats.set_item("request_seconds_buckets", snapshot.buckets)?;
        stats.set_item("request_seconds_sum", snapshot.seconds)?;
        stats.set_item("dropped_cancelled", snapshot.dropped_cancelled)?;
        stats.set_item("dropped_deadline", snapshot.dropped_deadline)?;
        stats.set_item("saturated_tokens_per_second", self.stats.saturated())?;
        Ok(stats)
    }
}

/// The Rust side's lines on stderr beside the Python logger's, in the same shape (JSON or text)
/// under the logger `embedfleet.worker.front`: the worker's --log-level and --log-format. Once
/// per process: a second `serve` keeps the first's.
fn init_logs(level: &str, json: bool) {
    let naming = embedfleet_logs::Naming {
        target: "embedfleet_front",
        logger: "embedfleet.worker.front",
    };
    embedfleet_logs::init(embedfleet_logs::level(level), json, naming);
}

#[pymodule]
fn embedfleet_front(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyServer>()
}
