//! The Worker service: admission and queueing of Embed and EmbedStream calls, and Info. As the
//! Python front (server.py): past the byte budget RESOURCE_EXHAUSTED; draining UNAVAILABLE;
//! over the hard token limit INVALID_ARGUMENT at once; a full queue RESOURCE_EXHAUSTED. The
//! rest of the checks (options, the token batch, the engine's own) run in Python, per batch.
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::generated::worker_server::Worker;
use crate::limits::{Held, Limits};
use crate::pb;
use crate::queue::{Entry, Outcome, Queue, Reply, Rpc};
use crate::stats::{OpenStream, Stats};
use crate::wire::{CallShape, RequestShape, Size};

#[derive(Clone)]
pub struct Front {
    pub queue: Arc<Queue>,
    pub limits: Arc<Limits>,
    pub stats: Arc<Stats>,
    /// Info's fixed fields (the model, the engine, this process's instance id).
    pub info: Arc<pb::InfoResponse>,
    /// Set at the end of the drain: open EmbedStreams stop reading and end once answered.
    pub closing: watch::Receiver<bool>,
    /// Tracing is on: each unary call's trace context goes with it to the batch call.
    pub traced: bool,
}

/// A refusal of one call: its status goes to that call only (a stream goes on).
type Refusal = (Reply, Status);

/// What a call brings to the queue besides its message: where its answer goes, by when, its
/// share of the byte budget (a stream call's) and its trace context (a traced unary call's).
struct Arrival {
    reply: Reply,
    deadline: Option<Instant>,
    held: Option<Held>,
    trace: Option<(String, String)>,
}

impl Front {
    /// Queue one request, or give its reply target back with why not.
    #[allow(clippy::result_large_err)] // tonic's Status, as every handler returns it
    fn submit(
        &self,
        rpc: Rpc,
        payload: Bytes,
        size: Size,
        arrival: Arrival,
    ) -> Result<(), Refusal> {
        let Arrival {
            reply,
            deadline,
            held,
            trace,
        } = arrival;
        if self.limits.draining() {
            return Err((reply, Status::unavailable("the worker is draining")));
        }
        let hard = self.queue.budget().hard_max_tokens;
        if size.consistent && size.tokens > hard {
            let message = format!(
                "the request has {} tokens; the limit is {hard}",
                size.tokens
            );
            return Err((reply, Status::invalid_argument(message)));
        }
        self.stats.arrived();
        let entry = Entry {
            rpc,
            tokens: size.tokens,
            sequences: size.sequences,
            deadline,
            arrived: Instant::now(),
            payload,
            reply,
            trace,
            held,
        };
        self.queue.push(entry).map_err(|(entry, queued)| {
            let message = format!("the worker's queue is full: {queued} requests already queued");
            (entry.reply, Status::resource_exhausted(message))
        })
    }

    /// One EmbedStream message; Err ends the stream (a message that cannot be read: its id is
    /// unknown, so the caller fails every call in flight on it, as on a broken connection).
    #[allow(clippy::result_large_err)] // tonic's Status, as every handler returns it
    fn stream_call(
        &self,
        message: Bytes,
        tx: &mpsc::UnboundedSender<Outcome>,
    ) -> Result<(), Status> {
        let held = self
            .limits
            .take(message.len())
            .map_err(Status::resource_exhausted)?;
        let call = CallShape::decode(message).map_err(|e| malformed("EmbedStream", &e))?;
        let size = size_of(&call.request).map_err(|e| malformed("EmbedStream", &e))?;
        // A timeout too large for a Duration (or NaN) is no deadline, as 0 is.
        let deadline = (call.timeout_seconds > 0.0)
            .then(|| Duration::try_from_secs_f64(call.timeout_seconds).ok())
            .flatten()
            .and_then(|timeout| Instant::now().checked_add(timeout));
        let reply = Reply::Stream {
            id: call.id,
            tx: tx.clone(),
            stats: Arc::clone(&self.stats),
            arrived: Instant::now(),
        };
        let arrival = Arrival {
            reply,
            deadline,
            held: Some(held),
            trace: None,
        };
        let submitted = self.submit(Rpc::Embed, call.request, size, arrival);
        if let Err((reply, status)) = submitted {
            reply.send(Err(status));
        }
        Ok(())
    }

    async fn read_stream(self, mut calls: Streaming<Bytes>, tx: mpsc::UnboundedSender<Outcome>) {
        let mut closing = self.closing.clone();
        loop {
            let message = tokio::select! {
                message = calls.message() => message,
                changed = closing.changed() => {
                    // The drain's end (or the server gone): read no more calls.
                    if changed.is_err() || *closing.borrow() {
                        break;
                    }
                    continue;
                }
            };
            match message {
                Ok(Some(message)) => {
                    if let Err(status) = self.stream_call(message, &tx) {
                        self.stats.record("EmbedStream", status.code(), None);
                        let _ = tx.send(Err(status));
                        break;
                    }
                }
                // The caller is done writing: the calls in flight are still answered, and
                // the stream ends with the last.
                Ok(None) => break,
                // A message past the size limit (or a broken transport, where the status
                // goes nowhere) ends the stream with that status, as a refused one does.
                Err(status) => {
                    let status = too_large_as_exhausted(status);
                    if status.code() == tonic::Code::ResourceExhausted {
                        self.stats.record("EmbedStream", status.code(), None);
                    }
                    let _ = tx.send(Err(status));
                    break;
                }
            }
        }
    }

    /// A unary call, its outcome and time counted (CANCELLED if its client leaves first).
    async fn unary(&self, rpc: Rpc, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        let mut counting = self.stats.counting(rpc.name());
        let answered = self.answer(rpc, request).await;
        counting.code = answered
            .as_ref()
            .err()
            .map_or(tonic::Code::Ok, Status::code);
        answered
    }

    /// A unary call: admitted, queued, answered by the engine thread.
    async fn answer(&self, rpc: Rpc, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        let deadline = deadline_of(request.metadata());
        let trace = self.traced.then(|| trace_context(request.metadata()));
        let payload = request.into_inner();
        // Held until the reply is handed to the transport (this function's end).
        let held = self
            .limits
            .take(payload.len())
            .map_err(Status::resource_exhausted)?;
        let size = size_of(&payload).map_err(|e| malformed(rpc.name(), &e))?;
        let (tx, rx) = oneshot::channel();
        let arrival = Arrival {
            reply: Reply::Unary(tx),
            deadline,
            held: None,
            trace,
        };
        if let Err((_, status)) = self.submit(rpc, payload, size, arrival) {
            return Err(status);
        }
        // The deadline as gRPC's C core answers it (the Python front's server): the queued
        // request is then dropped unrun, its receiver gone.
        let answered = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), rx)
                .await
                .map_err(|_| Status::deadline_exceeded("Deadline Exceeded"))?,
            None => rx.await,
        };
        let outcome = answered.map_err(|_| Status::unavailable("the engine thread stopped"))?;
        drop(held);
        outcome.map(Response::new)
    }
}

/// tonic refuses a message over the size limit with OUT_OF_RANGE; gRPC's C core (the Python
/// front) with RESOURCE_EXHAUSTED, which callers treat as "too much at once", not a bad value.
pub fn too_large_as_exhausted(status: Status) -> Status {
    if status.code() == tonic::Code::OutOfRange && status.message().contains(TOO_LARGE) {
        return Status::resource_exhausted(status.message());
    }
    status
}

/// The start of tonic's message for a message over the size limit (tonic 0.12, codec/decode.rs).
pub const TOO_LARGE: &str = "decoded message length too large";

fn malformed(rpc: &str, error: &prost::DecodeError) -> Status {
    Status::invalid_argument(format!("malformed {rpc} request: {error}"))
}

fn size_of(request: &Bytes) -> Result<Size, prost::DecodeError> {
    let shape = RequestShape::decode(request.clone())?;
    Ok(shape.batch.unwrap_or_default().size())
}

/// The call's W3C trace context: its traceparent and tracestate, "" where absent.
fn trace_context(metadata: &MetadataMap) -> (String, String) {
    let header = |name: &str| {
        metadata
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    (header("traceparent"), header("tracestate"))
}

/// The call's gRPC deadline (its grpc-timeout header), if it has one.
fn deadline_of(metadata: &MetadataMap) -> Option<Instant> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (amount, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = amount.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    };
    Instant::now().checked_add(timeout)
}

#[tonic::async_trait]
impl Worker for Front {
    async fn embed(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::Embed, request).await
    }

    async fn score(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::Score, request).await
    }

    async fn classify(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::Classify, request).await
    }

    async fn sparse_embed(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::SparseEmbed, request).await
    }

    async fn multi_vector_embed(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::MultiVectorEmbed, request).await
    }

    async fn hybrid_embed(&self, request: Request<Bytes>) -> Result<Response<Bytes>, Status> {
        self.unary(Rpc::HybridEmbed, request).await
    }

    type EmbedStreamStream = Replies;

    async fn embed_stream(
        &self,
        request: Request<Streaming<Bytes>>,
    ) -> Result<Response<Self::EmbedStreamStream>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Each queued call holds a sender too: the stream ends once the reader is done and
        // every call is answered.
        let open = self.stats.stream_opened();
        tokio::spawn(self.clone().read_stream(request.into_inner(), tx));
        Ok(Response::new(Replies {
            replies: UnboundedReceiverStream::new(rx),
            _open: open,
        }))
    }

    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let mut reply = (*self.info).clone();
        let (requests, tokens) = self.queue.queued();
        reply.queued_requests = u32::try_from(requests).unwrap_or(u32::MAX);
        reply.queued_tokens = tokens as u64;
        reply.draining = self.limits.draining();
        reply.ready = !reply.draining;
        reply.max_batch_tokens = u32::try_from(self.queue.budget().max_tokens).unwrap_or(u32::MAX);
        let capacity = self.stats.capacity();
        if capacity > 0.0 {
            reply.capacity_tokens_per_second = capacity;
        }
        reply.saturated_tokens_per_second = self.stats.saturated();
        self.stats.record("Info", tonic::Code::Ok, None);
        Ok(Response::new(reply))
    }
}

/// An EmbedStream's replies, the stream counted open until they end.
pub struct Replies {
    replies: UnboundedReceiverStream<Outcome>,
    _open: OpenStream,
}

impl Stream for Replies {
    type Item = Outcome;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outcome>> {
        Pin::new(&mut self.replies).poll_next(cx)
    }
}
