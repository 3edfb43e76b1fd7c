//! The FCFS queue (as worker/src/embedfleet/worker/scheduler.py): batches bounded by a token
//! budget and a sequence cap, taken strictly in arrival order, the batch closing at the first
//! request that does not fit (so a large request is never starved by small ones); a request over
//! the budget runs alone. Requests whose caller has gone or whose deadline passed are dropped at
//! the head without compute.
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::limits::Held;
use crate::stats::Stats;
use crate::wire::ReplyShape;

pub type Outcome = Result<Bytes, Status>;

#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Token budget of one batch; a single request above it runs alone.
    pub max_tokens: usize,
    /// Most sequences in one batch; a single request above it runs alone.
    pub max_sequences: usize,
    /// A request above this many tokens is refused outright.
    pub hard_max_tokens: usize,
}

/// Where a request's answer goes.
pub enum Reply {
    Unary(oneshot::Sender<Outcome>),
    /// A capacity probe's: the Python side hands its result over itself.
    Probe,
    /// One EmbedStream call: its EmbedReply goes straight into the stream's outbound queue,
    /// its outcome counted as an Embed call's once sent (a unary call's handler counts its own).
    Stream {
        id: u64,
        tx: mpsc::UnboundedSender<Outcome>,
        stats: Arc<Stats>,
        arrived: Instant,
    },
}

impl Reply {
    /// The caller is gone (a unary call cancelled, or its stream closed).
    fn gone(&self) -> bool {
        match self {
            Reply::Unary(tx) => tx.is_closed(),
            Reply::Stream { tx, .. } => tx.is_closed(),
            Reply::Probe => false,
        }
    }

    pub fn send(self, outcome: Outcome) {
        match self {
            Reply::Unary(tx) => {
                let _ = tx.send(outcome); // a caller gone meanwhile has nothing to be told
            }
            Reply::Probe => {}
            Reply::Stream {
                id,
                tx,
                stats,
                arrived,
            } => {
                let code = outcome.as_ref().err().map_or(tonic::Code::Ok, Status::code);
                stats.record("Embed", code, Some(arrived.elapsed()));
                let reply = match outcome {
                    Ok(response) => ReplyShape {
                        id,
                        response,
                        ..Default::default()
                    },
                    Err(status) => ReplyShape {
                        id,
                        code: status.code() as i32,
                        message: status.message().to_owned(),
                        ..Default::default()
                    },
                };
                let _ = tx.send(Ok(reply.encode_to_vec().into()));
            }
        }
    }
}

/// The unary methods whose requests the engine computes (their messages all open with a
/// TokenBatch); EmbedStream's calls are Embed's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    Embed,
    Score,
    Classify,
    SparseEmbed,
    MultiVectorEmbed,
    HybridEmbed,
    /// Capacity measurement work from the Python side (its payload a probe's id).
    Probe,
}

impl Rpc {
    /// The gRPC method name, which the Python side answers by (rust_front.RPCS).
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Embed => "Embed",
            Rpc::Score => "Score",
            Rpc::Classify => "Classify",
            Rpc::SparseEmbed => "SparseEmbed",
            Rpc::MultiVectorEmbed => "MultiVectorEmbed",
            Rpc::HybridEmbed => "HybridEmbed",
            Rpc::Probe => "Probe",
        }
    }
}

pub struct Entry {
    pub rpc: Rpc,
    pub tokens: usize,
    pub sequences: usize,
    pub deadline: Option<Instant>,
    /// When it was queued (its queue wait is measured from here).
    pub arrived: Instant,
    /// The EmbedRequest's bytes, as the client sent them.
    pub payload: Bytes,
    pub reply: Reply,
    /// With tracing on, a unary call's (traceparent, tracestate) metadata, "" where absent:
    /// the Python side records its spans (embedfleet.worker.tracing.record_call).
    pub trace: Option<(String, String)>,
    /// A stream call's share of the byte budget and of the in-flight count, released once
    /// answered (a unary call's handler holds its own until it returns).
    #[allow(dead_code)] // kept for its Drop
    pub held: Option<Held>,
}

impl Entry {
    fn drop_reason(&self, now: Instant) -> Option<Status> {
        // Deadline first: an expired unary call is also cancelled by its transport.
        if self.deadline.is_some_and(|d| now >= d) {
            return Some(Status::deadline_exceeded("deadline passed while queued"));
        }
        if self.reply.gone() {
            return Some(Status::cancelled("cancelled while queued"));
        }
        None
    }
}

struct State {
    items: VecDeque<Entry>,
    tokens: usize,
    stopping: bool,
    budget: Budget,
}

/// The queue shared by the server's handlers and the engine thread.
pub struct Queue {
    state: Mutex<State>,
    wake: Condvar,
    max_requests: usize,
}

/// What `take_within` found.
pub enum Next {
    Taken(Taken),
    /// Nothing arrived in time.
    Nothing,
    /// Stopped, and nothing is left.
    Stopped,
}

/// What the engine thread takes at once: a batch to compute, and the requests dropped unrun.
pub struct Taken {
    pub batch: Vec<Entry>,
    pub dropped: Vec<(Entry, Status)>,
    /// The budget cut the batch while more work waited: the worker is saturated.
    pub saturated: bool,
    /// The engine thread waited for work before this: it was idle.
    pub idled: bool,
}

impl Queue {
    pub fn new(budget: Budget, max_requests: usize) -> Self {
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                tokens: 0,
                stopping: false,
                budget,
            }),
            wake: Condvar::new(),
            max_requests,
        }
    }

    pub fn budget(&self) -> Budget {
        self.lock().budget
    }

    /// The token budget of batches from now on (paced once capacity is measured).
    pub fn set_max_tokens(&self, max_tokens: usize) {
        self.lock().budget.max_tokens = max_tokens.max(1);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler cannot panic while holding it; a poisoned lock's data is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `entry`, or hand it back with how many are queued when the queue is full.
    #[allow(clippy::result_large_err)] // the entry itself, handed back on the rare refusal
    pub fn push(&self, entry: Entry) -> Result<(), (Entry, usize)> {
        let mut state = self.lock();
        if state.items.len() >= self.max_requests {
            let queued = state.items.len();
            return Err((entry, queued));
        }
        state.tokens += entry.tokens;
        state.items.push_back(entry);
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    /// (requests, tokens) waiting, for Info.
    pub fn queued(&self) -> (usize, usize) {
        let state = self.lock();
        (state.items.len(), state.tokens)
    }

    /// The engine thread finishes what is queued, then `take` returns None.
    pub fn stop(&self) {
        self.lock().stopping = true;
        self.wake.notify_all();
    }

    /// Blocks until there is a batch or a dropped request; None once stopped and empty.
    pub fn take(&self) -> Option<Taken> {
        let mut state = self.lock();
        let mut idled = false;
        loop {
            if let Some(mut taken) = self.taken(&mut state) {
                taken.idled = idled;
                return Some(taken);
            }
            if state.stopping {
                return None;
            }
            idled = true;
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// As `take`, waiting at most `wait` (while a launched batch computes: not idle).
    pub fn take_within(&self, wait: Duration) -> Next {
        let mut state = self.lock();
        if let Some(taken) = self.taken(&mut state) {
            return Next::Taken(taken);
        }
        if state.stopping {
            return Next::Stopped;
        }
        let (mut state, _) = self
            .wake
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner());
        match self.taken(&mut state) {
            Some(taken) => Next::Taken(taken),
            None if state.stopping => Next::Stopped,
            None => Next::Nothing,
        }
    }

    fn taken(&self, state: &mut State) -> Option<Taken> {
        let mut taken = self.next_batch(state, Instant::now());
        if taken.batch.is_empty() && taken.dropped.is_empty() {
            return None;
        }
        taken.saturated = !taken.batch.is_empty() && !state.items.is_empty();
        Some(taken)
    }

    /// The longest arrival-order prefix of live requests within the budget; the first live
    /// request is always taken, so one over the budget forms a batch by itself.
    fn next_batch(&self, state: &mut State, now: Instant) -> Taken {
        let mut taken = Taken {
            batch: Vec::new(),
            dropped: Vec::new(),
            saturated: false,
            idled: false,
        };
        let (mut tokens, mut sequences) = (0, 0);
        while let Some(head) = state.items.front() {
            if let Some(status) = head.drop_reason(now) {
                let head = pop(state);
                taken.dropped.push((head, status));
                continue;
            }
            if !taken.batch.is_empty()
                && (tokens + head.tokens > state.budget.max_tokens
                    || sequences + head.sequences > state.budget.max_sequences)
            {
                break;
            }
            let head = pop(state);
            tokens += head.tokens;
            sequences += head.sequences;
            taken.batch.push(head);
        }
        taken
    }
}

fn pop(state: &mut State) -> Entry {
    let entry = state.items.pop_front().expect("the head was just seen");
    state.tokens -= entry.tokens;
    entry
}
