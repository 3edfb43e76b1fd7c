//! A worker's EmbedStream: the coalescer's small calls as messages of one long-lived gRPC stream
//! per worker, answered by id in any order. A unary call costs the worker's gRPC front its
//! call set-up, a task, metadata and a status each; a message on an open stream costs a read
//! and a write (docs/benchmarks/gateway_cpu.md measures both side by side).
//!
//! The stream opens on the first call and again after it ends. When it ends (the worker drained,
//! died or refused a message it could not read), every call still waiting on it fails with the
//! stream's status, UNAVAILABLE if it ended cleanly: the pool then retries them elsewhere, as it
//! would a broken connection's unary calls. A worker without EmbedStream (older than the
//! gateway) answers UNIMPLEMENTED: the caller falls back to unary calls to it for good.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::upstream::proto::worker_client::WorkerClient;
use crate::upstream::proto::{EmbedCall, EmbedReply, EmbedRequest, EmbedResponse};

type Answer = Result<EmbedResponse, Status>;
/// calls waiting for their reply, by id; None once the stream has ended
type Waiting = Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>;

/// One open stream: its outbound queue and the calls waiting on it.
struct Link {
    outbound: mpsc::UnboundedSender<EmbedCall>,
    waiting: Arc<Waiting>,
}

pub struct EmbedStream {
    client: WorkerClient<Channel>,
    link: Mutex<Option<Arc<Link>>>,
    next_id: AtomicU64,
    /// the worker answered UNIMPLEMENTED: it has no EmbedStream
    unsupported: AtomicBool,
}

/// Takes a waiting call's entry back if its caller leaves before the reply (a timeout, a
/// client gone): a worker that never answers leaves nothing behind.
struct Forget<'a>(&'a Waiting, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(map) = self.0.lock().expect("stream lock").as_mut() {
            map.remove(&self.1);
        }
    }
}

/// A reply as its unary call's outcome. Pure.
// tonic's Status is the gRPC error every call here already returns.
#[allow(clippy::result_large_err)]
pub fn answer(reply: EmbedReply) -> Answer {
    if reply.code == 0 {
        reply
            .response
            .ok_or_else(|| Status::internal("an OK stream reply without a response"))
    } else {
        Err(Status::new(Code::from_i32(reply.code), reply.message))
    }
}

impl EmbedStream {
    pub fn new(client: WorkerClient<Channel>) -> Self {
        EmbedStream {
            client,
            link: Mutex::new(None),
            next_id: AtomicU64::new(1),
            unsupported: AtomicBool::new(false),
        }
    }

    /// False once the worker said it has no EmbedStream: send unary calls instead.
    pub fn supported(&self) -> bool {
        !self.unsupported.load(Ordering::Relaxed)
    }

    /// One Embed call on the stream; UNIMPLEMENTED (then `supported()` is false) where the
    /// worker has none. A call not answered within `timeout` is DEADLINE_EXCEEDED, and the
    /// worker drops it if still queued then (the message carries the same bound).
    pub async fn call(&self, request: EmbedRequest, timeout: Duration) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let link = self.link(id, tx)?;
        let _forget = Forget(&link.waiting, id);
        let call = EmbedCall {
            id,
            request: Some(request),
            timeout_seconds: timeout.as_secs_f64(),
        };
        if link.outbound.send(call).is_err() {
            return Err(Status::unavailable("the worker's stream ended"));
        }
        let result = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Status::unavailable("the worker's stream ended")),
            Err(_) => Err(Status::deadline_exceeded("Timeout expired")),
        };
        if matches!(&result, Err(s) if s.code() == Code::Unimplemented) {
            self.unsupported.store(true, Ordering::Relaxed);
        }
        result
    }

    /// The open stream with `tx` waiting on it as `id`; opens one if none is open.
    #[allow(clippy::result_large_err)]
    fn link(&self, id: u64, tx: oneshot::Sender<Answer>) -> Result<Arc<Link>, Status> {
        let mut slot = self.link.lock().expect("stream lock");
        if let Some(link) = slot.as_ref() {
            if let Some(map) = link.waiting.lock().expect("stream lock").as_mut() {
                map.insert(id, tx);
                return Ok(Arc::clone(link));
            }
        }
        let (outbound, rx) = mpsc::unbounded_channel();
        let waiting: Arc<Waiting> = Arc::new(Mutex::new(Some(HashMap::from([(id, tx)]))));
        let link = Arc::new(Link {
            outbound,
            waiting: Arc::clone(&waiting),
        });
        *slot = Some(Arc::clone(&link));
        let messages =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let mut client = self.client.clone();
        tokio::spawn(async move {
            let ended = match client.embed_stream(messages).await {
                Ok(replies) => deliver(replies.into_inner(), &waiting).await,
                Err(status) => status,
            };
            let left = waiting.lock().expect("stream lock").take();
            for (_, tx) in left.into_iter().flatten() {
                let _ = tx.send(Err(waited_on(&ended)));
            }
        });
        Ok(link)
    }
}

/// What a call still waiting when its stream ended fails with: the status the worker ended
/// the stream with, or UNAVAILABLE when the connection broke under it (the worker stopping or
/// dying: the call may not have run, and retried elsewhere it answers the same).
fn waited_on(ended: &Status) -> Status {
    if crate::upstream::failure::broken_connection(ended) {
        Status::unavailable(format!("the worker's stream broke: {}", ended.message()))
    } else {
        Status::new(ended.code(), ended.message())
    }
}

/// Hands each reply to its caller until the stream ends; the status it ended with.
async fn deliver(mut replies: tonic::Streaming<EmbedReply>, waiting: &Waiting) -> Status {
    loop {
        match replies.message().await {
            Ok(Some(reply)) => {
                let tx = waiting
                    .lock()
                    .expect("stream lock")
                    .as_mut()
                    .and_then(|map| map.remove(&reply.id));
                if let Some(tx) = tx {
                    let _ = tx.send(answer(reply));
                }
            }
            Ok(None) => return Status::unavailable("the worker ended its stream"),
            Err(status) => return status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_broken_under_its_calls_fails_them_retryably() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer gone");
        let broken = Status::from_error(Box::new(io));
        assert_eq!(broken.code(), Code::Unknown);
        let failed = waited_on(&broken);
        assert_eq!(failed.code(), Code::Unavailable);
        assert!(
            crate::upstream::failure::retryable(&failed)
                && crate::upstream::failure::ejects(&failed)
        );
        // A status the worker sent stays its own, an UNKNOWN one too (not retried).
        let sent = waited_on(&Status::unknown("Unexpected <class 'RuntimeError'>"));
        assert_eq!(sent.code(), Code::Unknown);
        assert!(!crate::upstream::failure::retryable(&sent));
        let refused = waited_on(&Status::invalid_argument("malformed EmbedStream request"));
        assert_eq!(refused.code(), Code::InvalidArgument);
    }

    #[test]
    fn a_reply_is_its_unary_calls_outcome() {
        let ok = EmbedReply {
            id: 3,
            code: 0,
            message: String::new(),
            response: Some(EmbedResponse {
                count: 1,
                ..Default::default()
            }),
        };
        assert_eq!(answer(ok).unwrap().count, 1);
        let bad = EmbedReply {
            id: 4,
            code: Code::InvalidArgument as i32,
            message: "dimensions 9 exceeds".into(),
            response: None,
        };
        let status = answer(bad).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "dimensions 9 exceeds");
        let empty = EmbedReply {
            id: 5,
            ..Default::default()
        };
        assert_eq!(answer(empty).unwrap_err().code(), Code::Internal);
    }
}
