//! The engine thread: takes FCFS batches off the queue and makes one Python call per batch.
//!
//! It holds one Python thread state for its whole life (made once by `with_gil`), releasing the
//! GIL only while it answers the last batch and waits for the next: a thread state made and
//! dropped per batch cost 15-45 µs per null-engine request (docs/benchmarks/online_path.md).
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tonic::{Code, Status};

use crate::queue::{Entry, Outcome, Queue, Taken};
use crate::stats::Stats;
use crate::throughput::BatchClock;

/// Runs until the queue is stopped and empty. `run_batch(list[(method, bytes, queue_wait,
/// trace context or None)])` is the Python side (embedfleet.worker.rust_front): for each request a serialized reply, or
/// (code, message); it observes the batch's metrics, the queue waits (seconds) among them.
pub fn run(queue: Arc<Queue>, stats: Arc<Stats>, run_batch: Py<PyAny>) {
    Python::with_gil(|py| {
        let run_batch = run_batch.bind(py);
        let queue: &Queue = &queue;
        let mut answered: Vec<(Entry, Outcome)> = Vec::new();
        let mut clock = BatchClock::default();
        loop {
            let done = std::mem::take(&mut answered);
            let taken = py.allow_threads(move || {
                for (entry, outcome) in done {
                    entry.reply.send(outcome);
                }
                queue.take()
            });
            let Some(Taken {
                batch,
                dropped,
                saturated,
                idled,
            }) = taken
            else {
                break;
            };
            if idled {
                clock.idled();
            }
            for (entry, status) in dropped {
                tracing::debug!(reason = ?status.code(), "request dropped unrun");
                stats.dropped(status.code());
                answered.push((entry, Err(status)));
            }
            if batch.is_empty() {
                continue;
            }
            let outcomes = call(py, run_batch, &batch);
            // Only what was computed: a refused request's tokens never reached the engine.
            let computed = batch
                .iter()
                .zip(&outcomes)
                .filter(|(_, outcome)| outcome.is_ok())
                .map(|(entry, _)| entry.tokens as u64)
                .sum();
            if let Some(rate) = clock.finished(computed, saturated, Instant::now()) {
                stats.set_saturated(rate);
            }
            answered.extend(batch.into_iter().zip(outcomes));
        }
    });
    tracing::info!("engine thread stopped");
}

/// One Python call for the batch; every request gets an outcome, an INTERNAL one if the call
/// itself failed (the Python side answers engine errors per request itself).
fn call(py: Python<'_>, run_batch: &Bound<'_, PyAny>, batch: &[Entry]) -> Vec<Outcome> {
    let calls = PyList::empty(py);
    let launched = Instant::now();
    for entry in batch {
        let waited = launched
            .saturating_duration_since(entry.arrived)
            .as_secs_f64();
        let call = (
            entry.rpc.name(),
            PyBytes::new(py, &entry.payload),
            waited,
            entry.trace.as_ref(),
        );
        if let Err(err) = calls.append(call) {
            return failed(batch.len(), &err.to_string());
        }
    }
    let returned = match run_batch.call1((calls,)) {
        Ok(returned) => returned,
        Err(err) => {
            tracing::error!(error = %err, "the Python batch call failed");
            return failed(batch.len(), &err.to_string());
        }
    };
    let outcomes: PyResult<Vec<Outcome>> = (|| {
        let list = returned.downcast::<PyList>()?;
        list.iter().map(|item| outcome(&item)).collect()
    })();
    match outcomes {
        Ok(outcomes) if outcomes.len() == batch.len() => outcomes,
        Ok(_) => failed(
            batch.len(),
            "the batch call returned a wrong number of replies",
        ),
        Err(err) => failed(batch.len(), &err.to_string()),
    }
}

fn outcome(item: &Bound<'_, PyAny>) -> PyResult<Outcome> {
    if let Ok(reply) = item.downcast::<PyBytes>() {
        return Ok(Ok(Bytes::copy_from_slice(reply.as_bytes())));
    }
    let refused = item.downcast::<PyTuple>()?;
    let code: i32 = refused.get_item(0)?.extract()?;
    let message: String = refused.get_item(1)?.extract()?;
    Ok(Err(Status::new(Code::from_i32(code), message)))
}

// tonic's Status is what a call fails with; boxed, each refusal would cost an allocation more.
#[allow(clippy::result_large_err)]
fn failed(count: usize, why: &str) -> Vec<Outcome> {
    (0..count)
        .map(|_| Err(Status::internal(format!("the engine failed: {why}"))))
        .collect()
}
