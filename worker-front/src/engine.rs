//! The engine thread: takes FCFS batches off the queue and hands each to Python in two calls,
//! `Batches.launch(calls)` (parse, check, the engine's step) and the returned launch's `finish()`
//! (wait for the results, make the replies). While batch N is not `ready()` (an asynchronous
//! engine: CUDA) the next batch is launched before N is finished, so N+1's packing and launches
//! overlap N's compute, as the Python front's runner does; at most two are in flight. A CPU
//! engine computes inside its step: its batch is ready at once and answered before the next.
//!
//! It holds one Python thread state for its whole life (made once by `with_gil`), releasing the
//! GIL only while it waits on the queue: a thread state made and dropped per batch cost 15-45 µs
//! per null-engine request (docs/benchmarks/online_path.md).
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tonic::{Code, Status};

use crate::queue::{Entry, Next, Outcome, Queue, Taken};
use crate::stats::Stats;
use crate::throughput::BatchClock;

/// How long the thread waits for a next batch before asking again whether the one in flight is
/// done: a GPU batch takes milliseconds, and asking costs a microsecond.
const POLL: Duration = Duration::from_micros(200);

/// Runs until the queue is stopped and empty. `batches.launch(list[(method, bytes, queue_wait,
/// trace context or None)])` is the Python side (embedfleet.worker.rust_front.Batches); its
/// launch's `finish()` gives each request's serialized reply, or (code, message).
pub fn run(queue: Arc<Queue>, stats: Arc<Stats>, batches: Py<PyAny>) {
    Python::with_gil(|py| {
        let mut engine = Engine {
            batches: batches.bind(py).clone(),
            stats: &stats,
            clock: BatchClock::default(),
        };
        let queue: &Queue = &queue;
        let mut inflight: Option<InFlight<'_>> = None;
        loop {
            let Some(current) = inflight.take() else {
                match py.allow_threads(|| queue.take()) {
                    Some(taken) => inflight = engine.start(py, taken),
                    None => break,
                }
                continue;
            };
            if current.ready() {
                engine.finish(current);
                continue;
            }
            match py.allow_threads(|| queue.take_within(POLL)) {
                Next::Taken(taken) => {
                    let next = engine.start(py, taken);
                    engine.finish(current);
                    inflight = next;
                }
                Next::Nothing => inflight = Some(current),
                Next::Stopped => engine.finish(current),
            }
        }
    });
    tracing::info!("engine thread stopped");
}

struct Engine<'py, 'a> {
    batches: Bound<'py, PyAny>,
    stats: &'a Stats,
    clock: BatchClock,
}

/// A launched batch: its requests and the Python launch, or the outcomes of a launch call that
/// failed itself.
struct InFlight<'py> {
    batch: Vec<Entry>,
    launch: Result<Bound<'py, PyAny>, Vec<Outcome>>,
    saturated: bool,
}

impl InFlight<'_> {
    /// Whether finishing would not wait (a failed `ready` call is left to `finish` to report).
    fn ready(&self) -> bool {
        match &self.launch {
            Ok(launch) => launch
                .call_method0("ready")
                .and_then(|ready| ready.extract::<bool>())
                .unwrap_or(true),
            Err(_) => true,
        }
    }
}

impl<'py> Engine<'py, '_> {
    /// The dropped requests answered, the batch launched (None when there is none).
    fn start(&mut self, py: Python<'py>, taken: Taken) -> Option<InFlight<'py>> {
        let Taken {
            batch,
            dropped,
            saturated,
            idled,
        } = taken;
        for (entry, status) in dropped {
            tracing::debug!(reason = ?status.code(), "request dropped unrun");
            self.stats.dropped(status.code());
            entry.reply.send(Err(status));
        }
        if idled {
            self.clock.idled();
        }
        if batch.is_empty() {
            return None;
        }
        let launch = launch(py, &self.batches, &batch);
        Some(InFlight {
            batch,
            launch,
            saturated,
        })
    }

    /// The batch's results waited for, timed and sent to each request.
    fn finish(&mut self, inflight: InFlight<'py>) {
        let InFlight {
            batch,
            launch,
            saturated,
        } = inflight;
        let outcomes = match launch {
            Ok(launch) => finish(&launch, batch.len()),
            Err(outcomes) => outcomes,
        };
        // Only what was computed: a refused request's tokens never reached the engine.
        let computed = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| outcome.is_ok())
            .map(|(entry, _)| entry.tokens as u64)
            .sum();
        if let Some(rate) = self.clock.finished(computed, saturated, Instant::now()) {
            self.stats.set_saturated(rate);
        }
        for (entry, outcome) in batch.into_iter().zip(outcomes) {
            entry.reply.send(outcome);
        }
    }
}

/// `Batches.launch` for the batch, or every request's INTERNAL outcome if the call failed.
fn launch<'py>(
    py: Python<'py>,
    batches: &Bound<'py, PyAny>,
    batch: &[Entry],
) -> Result<Bound<'py, PyAny>, Vec<Outcome>> {
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
            return Err(failed(batch.len(), &err.to_string()));
        }
    }
    batches.call_method1("launch", (calls,)).map_err(|err| {
        tracing::error!(error = %err, "the Python batch call failed");
        failed(batch.len(), &err.to_string())
    })
}

/// The launch's `finish()`: every request gets an outcome, an INTERNAL one if the call itself
/// failed (the Python side answers engine errors per request itself).
fn finish(launch: &Bound<'_, PyAny>, count: usize) -> Vec<Outcome> {
    let returned = match launch.call_method0("finish") {
        Ok(returned) => returned,
        Err(err) => {
            tracing::error!(error = %err, "the Python batch call failed");
            return failed(count, &err.to_string());
        }
    };
    let outcomes: PyResult<Vec<Outcome>> = (|| {
        let list = returned.downcast::<PyList>()?;
        list.iter().map(|item| outcome(&item)).collect()
    })();
    match outcomes {
        Ok(outcomes) if outcomes.len() == count => outcomes,
        Ok(_) => failed(count, "the batch call returned a wrong number of replies"),
        Err(err) => failed(count, &err.to_string()),
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
