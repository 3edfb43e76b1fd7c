//! embedfleet's worker front in Rust (issue 38): the gRPC server, the FCFS token-budget queue
//! and the byte budget, hosting the Python engine in-process. Python builds and warms the
//! engine (embedfleet.worker.rust_front), then calls `serve`, which holds its thread until the
//! drain is done; one Rust thread computes batches through a Python callable.
use std::sync::Arc;

use prost::Message;
use pyo3::prelude::*;

mod codec;
mod connections;
mod engine;
mod limits;
mod queue;
mod server;
mod service;
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

/// Serve the Worker service and grpc.health.v1 on `host:port` until SIGTERM or SIGINT and the
/// drain. `run_batch(list[bytes]) -> list[bytes | (code, message)]` computes a batch of
/// serialized EmbedRequests; `info` is the serialized InfoResponse's fixed part;
/// `on_listening(port)` is called once bound. The GIL is released throughout.
#[pyfunction]
#[pyo3(signature = (*, host, port, max_batch_tokens, max_batch_sequences, hard_max_tokens,
    max_queue_requests, max_inflight_bytes, max_message_bytes, drain_seconds, info, run_batch,
    on_listening, log_level = "info", json_logs = true))]
#[allow(clippy::too_many_arguments)] // keyword-only: each one named at the Python call
fn serve(
    py: Python<'_>,
    host: String,
    port: u16,
    max_batch_tokens: usize,
    max_batch_sequences: usize,
    hard_max_tokens: usize,
    max_queue_requests: usize,
    max_inflight_bytes: usize,
    max_message_bytes: usize,
    drain_seconds: f64,
    info: &[u8],
    run_batch: Py<PyAny>,
    on_listening: Py<PyAny>,
    log_level: &str,
    json_logs: bool,
) -> PyResult<()> {
    init_logs(log_level, json_logs);
    let info = pb::InfoResponse::decode(info)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let budget = queue::Budget {
        max_tokens: max_batch_tokens,
        max_sequences: max_batch_sequences,
        hard_max_tokens,
    };
    let queue = Arc::new(queue::Queue::new(budget, max_queue_requests));
    let limits = limits::Limits::new(max_inflight_bytes);
    let engine = {
        let queue = Arc::clone(&queue);
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || engine::run(queue, run_batch))?
    };
    let config = server::Config {
        host,
        port,
        max_message_bytes,
        drain_seconds,
    };
    let served = py.allow_threads(|| {
        let parts = server::Parts {
            queue: Arc::clone(&queue),
            limits,
            info,
            on_listening,
        };
        let served = server::run(config, parts);
        // Whatever ended serving, the engine thread answers what is queued and ends.
        queue.stop();
        let _ = engine.join();
        served
    });
    tracing::info!("stopped");
    served
}

/// The Rust side's lines on stderr beside the Python logger's: the worker's --log-level and
/// --log-format (JSON, or text). Once per process: a second `serve` keeps the first's.
fn init_logs(level: &str, json: bool) {
    let level = match level {
        "debug" => tracing::Level::DEBUG,
        "warning" => tracing::Level::WARN,
        "error" => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    };
    let logs = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    let _ = if json {
        logs.json().try_init()
    } else {
        logs.try_init()
    };
}

#[pymodule]
fn embedfleet_front(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(serve, module)?)
}
