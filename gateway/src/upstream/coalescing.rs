//! Many small Embed calls to one worker as one gRPC message while that worker is busy: while
//! `max_inflight` calls of small chunks (whole requests under `--min-chunk-tokens`; the caller
//! says) are in flight to a worker, the next small chunks wait, merged into one TokenBatch (bytes
//! joined) up to `max_tokens` and `max_sequences`; when a call returns, the oldest merged message
//! goes and its rows are cut back into each chunk's share. With fewer in flight a chunk goes at
//! once, alone; a large request's chunks always go at once and are not counted. A merged call's
//! failure reaches every chunk in it as its own;
//! INVALID_ARGUMENT (one bad chunk could cause it for all) sends each chunk again alone.
//!
//! Unless `--coalesce-inflight` says, the slots follow the device the worker's Info reports: one
//! for a worker computing on its CPU, two for one on an accelerator (`inflight_for`;
//! docs/gateway.md, "Coalescing", says why).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::upstream::proto::worker_client::WorkerClient;
use crate::upstream::proto::{EmbedRequest, TokenBatch};
use crate::upstream::stream::EmbedStream;

const MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// Calls in flight to a worker that computes on its CPU, and to one on an accelerator.
pub const CPU_INFLIGHT: usize = 1;
pub const ACCELERATOR_INFLIGHT: usize = 2;
/// Device types (InfoResponse.device, before any ":index") that compute on the worker's CPU.
const CPU_DEVICES: [&str; 3] = ["", "cpu", "null"];

/// Small calls in flight to a worker whose Info reports `device` (one engine's, or several
/// comma-separated) when `--coalesce-inflight` is unset. Pure.
pub fn inflight_for(device: &str) -> usize {
    let on_cpu = device
        .split(',')
        .all(|part| CPU_DEVICES.contains(&part.trim().split(':').next().unwrap_or("")));
    if on_cpu {
        CPU_INFLIGHT
    } else {
        ACCELERATOR_INFLIGHT
    }
}

/// Rows (row-major float32) for one chunk, or why not; `Alone` asks it to go again by itself.
enum Share {
    Rows(Vec<f32>),
    Failed(Status),
    Alone,
}

struct Part {
    batch: TokenBatch,
    count: usize,
    tokens: usize,
    reply: oneshot::Sender<Share>,
}

struct Message {
    dims: u32,
    timeout: Duration,
    /// the first part's span: the merged call's traceparent (one trace per call)
    context: Option<crate::telemetry::traces::Context>,
    parts: Vec<Part>,
    tokens: usize,
    sequences: usize,
}

impl Message {
    fn wanted(&self) -> bool {
        self.parts.iter().any(|p| !p.reply.is_closed())
    }
}

#[derive(Default)]
struct State {
    /// calls of small chunks in flight (large ones are not counted: they never wait)
    inflight: usize,
    /// messages waiting for a free slot, oldest first, by id; the last of a key is still open
    waiting: VecDeque<u64>,
    messages: HashMap<u64, Message>,
    open: HashMap<u32, u64>,
    next_id: u64,
}

pub struct Coalescer {
    channel: Channel,
    /// read under `state`'s lock; stored by the probe when it follows the device
    max_inflight: AtomicUsize,
    /// the limit follows the worker's device (its Info), not the setting
    by_device: bool,
    max_tokens: usize,
    max_sequences: usize,
    /// the small calls' way to the worker, where on (`--coalesce-stream`) and the worker has one
    stream: Option<EmbedStream>,
    state: Mutex<State>,
}

fn client(channel: &Channel) -> WorkerClient<Channel> {
    WorkerClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// Consecutive blocks of `rows`, `counts[i] * dims` floats each. Pure.
pub fn cut(rows: &[f32], counts: &[usize], dims: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::with_capacity(counts.len());
    let mut start = 0;
    for n in counts {
        out.push(rows[start..start + n * dims].to_vec());
        start += n * dims;
    }
    out
}

impl Coalescer {
    pub fn new(
        channel: Channel,
        max_inflight: Option<usize>,
        max_tokens: usize,
        max_sequences: usize,
        stream: bool,
    ) -> Arc<Self> {
        Arc::new(Coalescer {
            stream: stream.then(|| EmbedStream::new(client(&channel))),
            channel,
            // Until its first Info answers, the worker takes no calls: a placeholder.
            max_inflight: AtomicUsize::new(max_inflight.unwrap_or(CPU_INFLIGHT)),
            by_device: max_inflight.is_none(),
            max_tokens,
            max_sequences,
            state: Mutex::new(State::default()),
        })
    }

    pub fn client(&self) -> WorkerClient<Channel> {
        client(&self.channel)
    }

    /// What the worker's Info said it computes on: the slots, where they follow the device.
    pub fn learn_device(&self, device: &str) {
        if self.by_device {
            self.max_inflight
                .store(inflight_for(device), Ordering::Relaxed);
        }
    }

    fn max_inflight(&self) -> usize {
        self.max_inflight.load(Ordering::Relaxed)
    }

    /// A small (coalesced) call: a message of the worker's EmbedStream where it has one.
    async fn send_small(
        &self,
        batch: TokenBatch,
        dims: u32,
        timeout: Duration,
    ) -> Result<(Vec<f32>, usize), Status> {
        if let Some(stream) = self.stream.as_ref().filter(|s| s.supported()) {
            let request = EmbedRequest {
                batch: Some(batch.clone()),
                dimensions: dims,
                ..Default::default()
            };
            match stream.call(request, timeout).await {
                Ok(reply) => {
                    return Ok((
                        crate::upstream::batch::rows(&reply),
                        reply.dimensions as usize,
                    ))
                }
                // A worker older than this gateway: unary calls from now on.
                Err(status) if status.code() == Code::Unimplemented => {}
                Err(status) => return Err(status),
            }
        }
        self.send(batch, dims, None, timeout).await
    }

    async fn send(
        &self,
        batch: TokenBatch,
        dims: u32,
        normalize: Option<bool>,
        timeout: Duration,
    ) -> Result<(Vec<f32>, usize), Status> {
        let request = EmbedRequest {
            batch: Some(batch),
            dimensions: dims,
            normalize,
            ..Default::default()
        };
        let mut call = tonic::Request::new(request);
        call.set_timeout(timeout);
        crate::telemetry::traces::inject(&mut call);
        let reply = self.client().embed(call).await?.into_inner();
        Ok((
            crate::upstream::batch::rows(&reply),
            reply.dimensions as usize,
        ))
    }

    /// One chunk's rows from this worker; a `small` one (a whole small request) is merged with
    /// other small chunks while the worker is busy.
    pub async fn embed(
        self: &Arc<Self>,
        batch: TokenBatch,
        dims: u32,
        normalize: Option<bool>,
        small: bool,
        timeout: Duration,
    ) -> Result<Vec<f32>, Status> {
        let tokens = batch.token_ids.len() / 4;
        if self.max_inflight() == 0 || !small || normalize.is_some() {
            // A large request carries its own framing well, and its chunks must reach the
            // workers together, however small each is (paced to a slow worker's second, they
            // can be): none waits, nor holds small ones up, and the worker queues what it
            // cannot start. The windows of a split input (unnormalized) are rare and travel on
            // their own.
            return self
                .send(batch, dims, normalize, timeout)
                .await
                .map(|(rows, _)| rows);
        }
        let (tx, rx) = oneshot::channel();
        let now = {
            let mut state = self.state.lock().expect("coalescer lock");
            if state.inflight < self.max_inflight() && state.waiting.is_empty() {
                state.inflight += 1;
                true
            } else {
                let count = batch.lengths.len() / 4;
                let part = Part {
                    batch: batch.clone(),
                    count,
                    tokens,
                    reply: tx,
                };
                self.enqueue(&mut state, dims, timeout, part);
                false
            }
        };
        if now {
            return self.alone(batch, dims, timeout).await;
        }
        match rx.await {
            Ok(Share::Rows(rows)) => Ok(rows),
            Ok(Share::Failed(status)) => Err(status),
            Ok(Share::Alone) => {
                self.state.lock().expect("coalescer lock").inflight += 1;
                self.alone(batch, dims, timeout).await
            }
            // The message was dropped unsent (this process is closing it): retryable elsewhere.
            Err(_) => Err(Status::cancelled("the worker's channel closed")),
        }
    }

    /// A call already counted in `inflight`; frees its slot however it ends.
    async fn alone(
        self: &Arc<Self>,
        batch: TokenBatch,
        dims: u32,
        timeout: Duration,
    ) -> Result<Vec<f32>, Status> {
        struct Slot<'a>(&'a Arc<Coalescer>);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                let mut state = self.0.state.lock().expect("coalescer lock");
                state.inflight -= 1;
                self.0.next(&mut state);
            }
        }
        let _slot = Slot(self);
        self.send_small(batch, dims, timeout)
            .await
            .map(|(rows, _)| rows)
    }

    fn enqueue(&self, state: &mut State, dims: u32, timeout: Duration, part: Part) {
        let fits = |m: &Message| {
            m.tokens + part.tokens <= self.max_tokens
                && m.sequences + part.count <= self.max_sequences
        };
        let id = match state.open.get(&dims) {
            Some(id) if fits(&state.messages[id]) => *id,
            _ => {
                let id = state.next_id;
                state.next_id += 1;
                let message = Message {
                    dims,
                    timeout,
                    context: crate::telemetry::traces::current(),
                    parts: Vec::new(),
                    tokens: 0,
                    sequences: 0,
                };
                state.messages.insert(id, message);
                state.open.insert(dims, id);
                state.waiting.push_back(id);
                id
            }
        };
        let m = state
            .messages
            .get_mut(&id)
            .expect("an open message is kept");
        m.timeout = m.timeout.min(timeout);
        m.tokens += part.tokens;
        m.sequences += part.count;
        m.parts.push(part);
    }

    /// Sends waiting messages while slots are free (those whose chunks' callers left: dropped).
    fn next(self: &Arc<Self>, state: &mut State) {
        while state.inflight < self.max_inflight() {
            let Some(id) = state.waiting.pop_front() else {
                return;
            };
            let message = state
                .messages
                .remove(&id)
                .expect("a waiting message is kept");
            if state.open.get(&message.dims) == Some(&id) {
                state.open.remove(&message.dims);
            }
            if !message.wanted() {
                continue;
            }
            state.inflight += 1;
            let me = Arc::clone(self);
            tokio::spawn(async move { me.merged(message).await });
        }
    }

    async fn merged(self: Arc<Self>, message: Message) {
        let parts: Vec<Part> = message
            .parts
            .into_iter()
            .filter(|p| !p.reply.is_closed())
            .collect();
        let batch = if parts.len() == 1 {
            parts[0].batch.clone()
        } else {
            TokenBatch {
                token_ids: parts
                    .iter()
                    .flat_map(|p| p.batch.token_ids.iter().copied())
                    .collect(),
                lengths: parts
                    .iter()
                    .flat_map(|p| p.batch.lengths.iter().copied())
                    .collect(),
                token_type_ids: Vec::new(),
                // Embed calls: no PyLate query (a multi-vector model's) is ever among them
                key_lengths: Vec::new(),
            }
        };
        let counts: Vec<usize> = parts.iter().map(|p| p.count).collect();
        let total: usize = counts.iter().sum();
        let sent = self.send_small(batch, message.dims, message.timeout);
        let result = crate::telemetry::traces::within(message.context, sent).await;
        let shares = match result {
            Ok((rows, dims)) if dims > 0 && rows.len() == total * dims => {
                Ok(cut(&rows, &counts, dims))
            }
            Ok((rows, dims)) => Err(Status::internal(format!(
                "{} floats of {dims} dimensions for {total} rows",
                rows.len()
            ))),
            Err(status) => Err(status),
        };
        let several = parts.len() > 1;
        match shares {
            Ok(shares) => {
                for (p, share) in parts.into_iter().zip(shares) {
                    let _ = p.reply.send(Share::Rows(share));
                }
            }
            Err(status) => {
                for p in parts {
                    let share = if status.code() == Code::InvalidArgument && several {
                        Share::Alone
                    } else {
                        Share::Failed(Status::new(status.code(), status.message()))
                    };
                    let _ = p.reply.send(share);
                }
            }
        }
        let mut state = self.state.lock().expect("coalescer lock");
        state.inflight -= 1;
        self.next(&mut state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_sets_the_calls_in_flight() {
        for cpu in ["", "cpu", "null", "cpu,cpu"] {
            assert_eq!(inflight_for(cpu), CPU_INFLIGHT, "{cpu}");
        }
        for accelerator in ["cuda", "cuda:0", "cuda:0,cuda:1", "cpu,cuda:1", "mps"] {
            assert_eq!(
                inflight_for(accelerator),
                ACCELERATOR_INFLIGHT,
                "{accelerator}"
            );
        }
    }

    #[test]
    fn cut_gives_each_chunk_its_rows() {
        let rows: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let parts = cut(&rows, &[1, 2], 4);
        assert_eq!(parts[0], vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(parts[1].len(), 8);
        assert_eq!(parts[1][0], 4.0);
    }
}
