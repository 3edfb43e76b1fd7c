//! embedfleet's worker front in Rust (issue 38): the gRPC server, the FCFS token-budget queue
//! and the byte budget, hosting the Python engine in-process. Python builds and warms the
//! engine (embedfleet.worker.rust_front), then calls `serve`, which holds its thread until the
//! drain is done; one Rust thread computes batches through a Python callable.
use std::sync::Arc;

use prost::Message;
use pyo3::prelude::*;

mod codec;
mod engine;
mod limits;
mod queue;
mod serve;
mod service;
mod wire;

/// The protocol's messages (embedfleet.proto).
pub mod pb {
    tonic::include_proto!("embedfleet.v1");
}

/// The Worker service's server side (build.rs lists its methods).
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
    on_listening))]
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
) -> PyResult<()> {
    let _ = tracing_subscriber::fmt().json().with_writer(std::io::stderr).try_init();
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
    let config = serve::Config { host, port, max_message_bytes, drain_seconds };
    let served = py.allow_threads(|| {
        let served = serve::run(config, Arc::clone(&queue), limits, info, on_listening);
        // Whatever ended serving, the engine thread answers what is queued and ends.
        queue.stop();
        let _ = engine.join();
        served
    });
    tracing::info!("stopped");
    served
}

#[pymodule]
fn embedfleet_front(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(serve, module)?)
}
