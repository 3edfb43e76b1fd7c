//! The workers: one tonic channel each, probed with Info for readiness and capacity (the
//! Python gateway's pool.py), the set changed live by discovery (`update`), and chunks
//! dispatched to them with one retry elsewhere for a failure that says the worker never ran
//! the chunk (dispatcher.py, upstream.py).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Endpoint as Target;
use tonic::{Code, Status};

use crate::balancer::Balancer;
use crate::coalescing::Coalescer;
use crate::errors::{self, ApiError};
use crate::metrics::{Metrics, WorkerState};
use crate::proto::{
    ClassifyRequest, InfoRequest, InfoResponse, ScoreRequest, SparseEmbedRequest, TokenBatch,
};
use crate::trace::{self, Span, Tracer};
use prost::Message as _;

const ATTEMPTS: usize = 2;

/// When Embed calls to a worker are merged (coalescing.rs); `max_inflight` 0: never; None: as
/// many as the worker's device wants (coalescing::inflight_for, learned from its Info).
#[derive(Debug, Clone, Copy)]
pub struct Coalescing {
    pub max_inflight: Option<usize>,
    pub max_tokens: usize,
    pub max_sequences: usize,
    pub small_tokens: usize,
    /// small calls on the worker's EmbedStream rather than each a unary Embed
    pub stream: bool,
}

pub struct Pool {
    balancer: Mutex<Balancer>,
    /// each endpoint's connection and probe task, by endpoint id; locked after the balancer
    workers: Mutex<HashMap<u64, Member>>,
    /// each worker's last Info in the order they first answered (model facts come from the
    /// first); locked after the balancer
    infos: Mutex<Vec<(u64, InfoResponse)>>,
    coalescing: Coalescing,
    /// whether any worker says it is ready, for `wait_ready`
    ready_tx: tokio::sync::watch::Sender<bool>,
    probe_seconds: f64,
    retry_after: u64,
    metrics: Arc<Metrics>,
    /// a CLIENT span per worker call, when tracing is on
    tracer: Tracer,
}

/// The workers' gRPC service, as spans name their calls.
const SERVICE: &str = "embedfleet.v1.Worker";

/// Outstanding tokens at one worker for as long as a call holds it, however the call ends (an
/// answer, an error, or the client going away and the future being dropped).
struct Lease<'a> {
    pool: &'a Pool,
    id: u64,
    tokens: usize,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut b = self.pool.balancer.lock().expect("balancer lock");
        // A worker removed meanwhile took its count with it.
        if let Some(e) = b.get_mut(self.id) {
            e.outstanding_tokens -= self.tokens;
        }
    }
}

/// A call in flight: dropped before its answer, it was cancelled (the request's future went).
struct Flight<'a> {
    metrics: &'a Metrics,
    done: bool,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled_calls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One worker's connection (shared with its calls in flight, which a removal lets finish), its
/// probe loop (stopped with the removal) and its hung signal: sent when a probe of the ready
/// worker fails, giving up the calls in flight there (a stopped process never answers, and its
/// connection can look alive for as long as the kernel keeps it).
struct Member {
    worker: Arc<Coalescer>,
    hung: Arc<Hung>,
    probe: tokio::task::JoinHandle<()>,
}

type Hung = tokio::sync::watch::Sender<()>;

/// Resolves when the worker is found hung after `signal` was subscribed; never once the worker
/// was removed (its calls in flight finish on the connection they hold).
async fn found_hung(signal: &mut tokio::sync::watch::Receiver<()>) {
    if signal.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What a call given up on a hung worker fails with: retryable elsewhere, and ejecting.
fn stopped_answering() -> Status {
    Status::unavailable("the worker stopped answering")
}

/// A worker address as a tonic target (http://host:port, IPv6 in brackets).
pub fn target(address: &str) -> Result<Target, String> {
    Ok(Target::from_shared(format!("http://{address}"))
        .map_err(|err| format!("{address}: {err}"))?
        // Notice a dead peer in seconds rather than waiting on TCP timeouts.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// gRPC's status names as Python's grpc.StatusCode spells them (the 502 message names it).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A peer that dies mid-stream can surface as INTERNAL/UNKNOWN with a transport message, or
/// (tonic) as UNKNOWN made from the transport's own error, which a status a worker sent never
/// carries: a connection the worker closed while stopping read "error reading a body from
/// connection" with no status of the worker's at all.
pub fn broken_connection(status: &Status) -> bool {
    let text = status.message().to_lowercase();
    matches!(status.code(), Code::Internal | Code::Unknown)
        && (std::error::Error::source(status).is_some()
            || ["rst_stream", "socket closed", "connection reset", "goaway"]
                .iter()
                .any(|s| text.contains(s)))
}

/// tonic reports its own client-side timeout as CANCELLED "Timeout expired"; gRPC (and Python's
/// grpc, which the Python gateway sees) calls that DEADLINE_EXCEEDED: a 504, not retried
/// elsewhere, where it would only wait out the bound again.
pub fn deadline_as_such(status: Status) -> Status {
    if status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        Status::deadline_exceeded(status.message().to_string())
    } else {
        status
    }
}

/// The worker never ran the chunk, or died: it may succeed elsewhere.
pub fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::ResourceExhausted | Code::Cancelled
    ) || broken_connection(status)
}

/// The worker (or the connection to it) is broken, not merely busy.
pub fn ejects(status: &Status) -> bool {
    status.code() == Code::Unavailable || broken_connection(status)
}

pub fn client_error(status: &Status, retry_after: u64) -> ApiError {
    match status.code() {
        Code::InvalidArgument => errors::invalid(format!(
            "The worker rejected the input: {}",
            status.message()
        )),
        Code::ResourceExhausted => {
            errors::overloaded(retry_after, "A worker's queue is full; retry later.")
        }
        Code::DeadlineExceeded => ApiError::new(504, "A worker did not answer in time.")
            .kind("server_error")
            .code("upstream_timeout"),
        code => ApiError::new(502, format!("A worker failed ({}).", code_name(code)))
            .kind("server_error")
            .code("upstream_error"),
    }
}

/// Tokens/s of the usable workers together; one that has not reported a measurement counts
/// at the mean of those that have (admission.fleet_capacity).
pub fn fleet_capacity(capacities: &[f64]) -> f64 {
    let known: Vec<f64> = capacities.iter().copied().filter(|&c| c > 0.0).collect();
    if known.is_empty() {
        return 0.0;
    }
    known.iter().sum::<f64>() * capacities.len() as f64 / known.len() as f64
}

/// Rows of one Embed reply as float32 (a worker may answer float16).
pub fn rows(reply: &crate::proto::EmbedResponse) -> Vec<f32> {
    let bytes = &reply.embeddings;
    if reply.format == crate::proto::FloatFormat::Float16 as i32 {
        bytes
            .chunks_exact(2)
            .map(|b| half_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

fn half_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // subnormal: normalise it
            let shift = frac.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((frac << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 112) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// The packed little-endian batch a worker reads; a pair's type ids one byte a token.
pub fn pack_pairs(seqs: &[Vec<u32>], types: &[Vec<u32>]) -> TokenBatch {
    let mut batch = pack(seqs);
    batch.token_type_ids = types.iter().flatten().map(|&t| t as u8).collect();
    batch
}

/// The packed little-endian batch a worker reads.
pub fn pack(seqs: &[Vec<u32>]) -> TokenBatch {
    let total: usize = seqs.iter().map(Vec::len).sum();
    let mut ids = Vec::with_capacity(total * 4);
    let mut lengths = Vec::with_capacity(seqs.len() * 4);
    for s in seqs {
        lengths.extend_from_slice(&(s.len() as i32).to_le_bytes());
        for &t in s {
            ids.extend_from_slice(&(t as i32).to_le_bytes());
        }
    }
    TokenBatch {
        token_ids: ids,
        lengths,
        token_type_ids: Vec::new(),
    }
}

type Signal = tokio::sync::watch::Receiver<()>;

enum Failure {
    NoWorker,
    Upstream(Status),
}

impl Pool {
    /// A pool with no workers yet: discovery gives them (`update`).
    pub fn new(
        eject_seconds: f64,
        probe_seconds: f64,
        retry_after: u64,
        coalescing: Coalescing,
        metrics: Arc<Metrics>,
        tracer: Tracer,
    ) -> Arc<Self> {
        Arc::new(Pool {
            tracer,
            balancer: Mutex::new(Balancer::new(&[], eject_seconds)),
            workers: Mutex::new(HashMap::new()),
            infos: Mutex::new(Vec::new()),
            coalescing,
            ready_tx: tokio::sync::watch::Sender::new(false),
            probe_seconds,
            retry_after,
            metrics,
        })
    }

    /// The worker set becomes `addresses` (those that are not valid addresses are logged and
    /// left out): new ones are connected lazily and probed; removed ones stop being chosen and
    /// probed at once, while their calls in flight finish on the connection they hold.
    pub fn update(self: &Arc<Self>, addresses: &[String]) {
        let valid: Vec<String> = addresses
            .iter()
            .filter(|a| match target(a) {
                Ok(_) => true,
                Err(e) => {
                    crate::log!(Warning, "worker address skipped", "error" => e.to_string());
                    false
                }
            })
            .cloned()
            .collect();
        let mut b = self.balancer.lock().expect("balancer lock");
        let (added, removed) = b.set_addresses(&valid);
        let mut workers = self.workers.lock().expect("workers lock");
        for e in &removed {
            if let Some(member) = workers.remove(&e.id) {
                member.probe.abort();
            }
        }
        if !removed.is_empty() {
            let mut infos = self.infos.lock().expect("infos lock");
            infos.retain(|(id, _)| !removed.iter().any(|e| e.id == *id));
        }
        let c = self.coalescing;
        for e in &added {
            let channel = target(&e.address).expect("validated above").connect_lazy();
            let worker = Coalescer::new(
                channel,
                c.max_inflight,
                c.max_tokens,
                c.max_sequences,
                c.small_tokens,
                c.stream,
            );
            let hung = Arc::new(Hung::new(()));
            let probe = tokio::spawn(Arc::clone(self).probe_loop(
                e.id,
                Arc::clone(&worker),
                Arc::clone(&hung),
            ));
            workers.insert(
                e.id,
                Member {
                    worker,
                    hung,
                    probe,
                },
            );
        }
        let count = b.endpoints.len();
        drop(workers);
        drop(b);
        self.sync_ready();
        if !added.is_empty() || !removed.is_empty() {
            // The Python gateway's line, field for field: log queries read either gateway.
            let names: Vec<&str> = added.iter().map(|e| e.address.as_str()).collect();
            let gone: Vec<&str> = removed.iter().map(|e| e.address.as_str()).collect();
            crate::log!(
                Info,
                "workers changed",
                "added" => names,
                "removed" => gone,
                "workers" => count,
            );
        }
    }

    /// Returns once `ready` holds (at once if it does now).
    pub async fn wait_ready(&self) {
        let mut ready = self.ready_tx.subscribe();
        // The sender lives as long as the pool, which outlives every request.
        let _ = ready.wait_for(|r| *r).await;
    }

    fn sync_ready(&self) {
        let now = self.ready();
        self.ready_tx
            .send_if_modified(|r| std::mem::replace(r, now) != now);
    }

    /// At least one worker says it is ready (ejected ones too: ejection is advice).
    pub fn ready(&self) -> bool {
        let b = self.balancer.lock().expect("balancer lock");
        b.endpoints.iter().any(|e| e.ready)
    }

    /// (usable workers, their measured tokens/s together)
    pub fn usable(&self) -> (usize, f64) {
        let b = self.balancer.lock().expect("balancer lock");
        let caps: Vec<f64> = b.usable(Instant::now()).map(|e| e.capacity).collect();
        (caps.len(), fleet_capacity(&caps))
    }

    /// Tokens other gateways queued at the usable workers, as of the last probes.
    pub fn queued_elsewhere(&self) -> usize {
        let b = self.balancer.lock().expect("balancer lock");
        b.usable(Instant::now()).map(|e| e.queued_elsewhere).sum()
    }

    /// The embedding dimension of the first worker that answered Info (0 until one has).
    pub fn dimensions(&self) -> u32 {
        let infos = self.infos.lock().expect("infos lock");
        infos.first().map_or(0, |(_, i)| i.dimensions)
    }

    /// Each known worker's outstanding tokens and state, for the worker gauges.
    pub fn worker_states(&self) -> Vec<WorkerState> {
        let b = self.balancer.lock().expect("balancer lock");
        let now = Instant::now();
        b.endpoints
            .iter()
            .map(|e| WorkerState {
                address: e.address.clone(),
                outstanding_tokens: e.outstanding_tokens,
                state: match (e.usable(now), e.ready) {
                    (true, _) => "ready",
                    (false, true) => "ejected",
                    (false, false) => "unready",
                },
            })
            .collect()
    }

    /// Whether the workers normalize by default (the first that answered Info; else true, as
    /// sentence-transformers embedders mostly do).
    pub fn default_normalize(&self) -> bool {
        let infos = self.infos.lock().expect("infos lock");
        infos.first().map_or(true, |(_, i)| i.default_normalize)
    }

    /// Probes one worker until it is removed (the task is aborted then).
    async fn probe_loop(self: Arc<Self>, id: u64, worker: Arc<Coalescer>, hung: Arc<Hung>) {
        loop {
            let ready = self.probe_once(id, &worker, &hung).await;
            self.sync_ready();
            // Poll fast while the worker is not ready, so it takes traffic soon.
            let pause = if ready {
                self.probe_seconds
            } else {
                self.probe_seconds.min(0.2)
            };
            tokio::time::sleep(Duration::from_secs_f64(pause)).await;
        }
    }

    async fn probe_once(&self, id: u64, worker: &Coalescer, hung: &Hung) -> bool {
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(Duration::from_secs_f64(self.probe_seconds.max(1.0)));
        let reply = worker.client().info(request).await;
        let mut b = self.balancer.lock().expect("balancer lock");
        let Some(e) = b.get_mut(id) else {
            return false; // removed while the probe was out
        };
        let info = match reply {
            Ok(r) => r.into_inner(),
            Err(status) => {
                if e.ready {
                    crate::log!(
                        Warning,
                        "worker not answering",
                        "worker" => e.address,
                        "code" => code_name(status.code()),
                    );
                    // Its calls in flight go elsewhere; later leases (none until it answers
                    // ready again: it is unready from here, under the same lock) see only a
                    // later signal.
                    hung.send_replace(());
                }
                e.ready = false;
                return false;
            }
        };
        worker.learn_device(&info.device);
        let was = e.ready;
        e.ready = info.ready && !info.draining;
        e.queued_elsewhere = (info.queued_tokens as usize).saturating_sub(e.outstanding_tokens);
        e.capacity = if info.saturated_tokens_per_second > 0.0 {
            info.saturated_tokens_per_second
        } else {
            info.capacity_tokens_per_second
        };
        let ready = e.ready;
        let mut infos = self.infos.lock().expect("infos lock");
        let known = infos.iter().position(|(i, _)| *i == id);
        let restarted = known.is_some_and(|k| infos[k].1.instance != info.instance);
        if ready && (restarted || !was) {
            // A worker that passed its start-up checks again is a fresh process.
            e.ejected_until = None;
        }
        // The Python gateway's two lines: a new process behind the address, or a change.
        if restarted {
            crate::log!(Info, "worker restarted", "worker" => e.address, "ready" => ready);
        } else if ready != was {
            crate::log!(Info, "worker readiness", "worker" => e.address, "ready" => ready);
        }
        match known {
            Some(k) => infos[k].1 = info,
            None => infos.push((id, info)),
        }
        ready
    }

    /// A worker for one call, its connection and its hung signal (as of now); its tokens count
    /// as outstanding there until the lease is dropped.
    fn lease(&self, tokens: usize, tried: &[u64]) -> Option<(Lease<'_>, Arc<Coalescer>, Signal)> {
        let mut b = self.balancer.lock().expect("balancer lock");
        let e = b.pick(tried, Instant::now())?;
        e.outstanding_tokens += tokens;
        let id = e.id;
        // The balancer's endpoints and the members change together under the balancer's lock.
        let workers = self.workers.lock().expect("workers lock");
        let member = &workers[&id];
        let (worker, hung) = (Arc::clone(&member.worker), member.hung.subscribe());
        drop(workers);
        Some((
            Lease {
                pool: self,
                id,
                tokens,
            },
            worker,
            hung,
        ))
    }

    /// A CLIENT span for one call of `rpc` with `batch` to the worker `id` (none untraced).
    fn client_span(&self, rpc: &'static str, batch: &TokenBatch, tokens: usize, id: u64) -> Span {
        if !self.tracer.enabled() {
            return Span::default();
        }
        let mut span = self
            .tracer
            .child(&format!("{SERVICE}/{rpc}"), trace::Kind::Client);
        let address = self
            .balancer
            .lock()
            .expect("balancer lock")
            .get_mut(id)
            .map(|e| e.address.clone())
            .unwrap_or_default();
        span.text("rpc.system", "grpc");
        span.text("rpc.service", SERVICE);
        span.text("rpc.method", rpc);
        span.text("server.address", &address);
        span.int("embedfleet.sequences", (batch.lengths.len() / 4) as i64);
        span.int("embedfleet.tokens", tokens as i64);
        // the batch's field of the request message (its options add a few bytes)
        span.int("rpc.request.size", batch.encoded_len() as i64);
        span
    }

    /// One call on a worker not yet tried; ejects that worker if the failure says it broke.
    async fn attempt<T, F, Fut>(
        &self,
        (rpc, batch, tokens): (&'static str, &TokenBatch, usize),
        call: &F,
        tried: &mut Vec<u64>,
    ) -> Result<T, Failure>
    where
        F: Fn(Arc<Coalescer>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let (lease, worker, mut hung) = self.lease(tokens, tried).ok_or(Failure::NoWorker)?;
        tried.push(lease.id);
        let mut span = self.client_span(rpc, batch, tokens, lease.id);
        let start = Instant::now();
        let mut flight = Flight {
            metrics: &self.metrics,
            done: false,
        };
        // Given up (the call's future dropped, so its stream is reset) once the worker is found
        // hung: no task and no timer per call, one watch receiver polled beside it. The call is
        // made under the client span, whose context its metadata carries (trace::inject).
        let called = trace::within(span.context(), async {
            tokio::select! {
                biased;
                called = call(worker) => called.map_err(deadline_as_such),
                () = found_hung(&mut hung) => Err(stopped_answering()),
            }
        })
        .await;
        flight.done = true;
        self.metrics.upstream(start.elapsed().as_secs_f64());
        let code = called.as_ref().map_or_else(Status::code, |_| Code::Ok);
        span.int("rpc.grpc.status_code", code as i64);
        if code != Code::Ok {
            span.error(code_name(code));
        }
        match called {
            Ok(rows) => Ok(rows),
            Err(status) => {
                if ejects(&status) {
                    let mut b = self.balancer.lock().expect("balancer lock");
                    if b.eject(lease.id, Instant::now()) {
                        self.metrics.ejections.fetch_add(1, Ordering::Relaxed);
                        let address = b.get_mut(lease.id).map(|e| e.address.clone());
                        crate::log!(
                            Warning,
                            "worker ejected",
                            "worker" => address.unwrap_or_default(),
                            "code" => code_name(status.code()),
                        );
                    }
                }
                Err(Failure::Upstream(status))
            }
        }
    }

    /// One chunk's `call` of `rpc` with `batch`, retried once on another worker when the failure
    /// allows it.
    async fn dispatch<T, F, Fut>(
        &self,
        (rpc, batch, tokens): (&'static str, &TokenBatch, usize),
        call: F,
    ) -> Result<T, ApiError>
    where
        F: Fn(Arc<Coalescer>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut tried = Vec::with_capacity(ATTEMPTS);
        let mut busy: Option<Status> = None;
        for attempt in 0..ATTEMPTS {
            match self.attempt((rpc, batch, tokens), &call, &mut tried).await {
                Ok(rows) => return Ok(rows),
                Err(Failure::NoWorker) => {
                    // The only worker is busy: a 429 to retry later, not "no worker".
                    return Err(match busy {
                        Some(status) => client_error(&status, self.retry_after),
                        None => errors::unavailable("No ready worker left to take the request."),
                    });
                }
                Err(Failure::Upstream(status)) => {
                    if !retryable(&status) || attempt + 1 == ATTEMPTS {
                        if let Some(held) = FAILED_CALL_LOG.allow(Instant::now()) {
                            // The answer says only the code: the reason is for the operator.
                            crate::log!(
                                Warning,
                                "worker call failed",
                                "code" => code_name(status.code()),
                                "reason" => status.message().to_string(),
                                "suppressed" => held,
                            );
                        }
                        return Err(client_error(&status, self.retry_after));
                    }
                    if status.code() == Code::ResourceExhausted {
                        busy = Some(status);
                    }
                    self.metrics.retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One chunk's embeddings (merged with other small chunks while the worker is busy).
    pub async fn embed(
        &self,
        batch: TokenBatch,
        dims: u32,
        normalize: Option<bool>,
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<f32>, ApiError> {
        self.dispatch(("Embed", &batch, tokens), |worker| {
            let batch = batch.clone();
            async move { worker.embed(batch, dims, normalize, timeout).await }
        })
        .await
    }

    /// One chunk's pair scores (the Score RPC, activated as the Python gateway asks).
    pub async fn score(
        &self,
        batch: TokenBatch,
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<f32>, ApiError> {
        let count = batch.lengths.len() / 4;
        let reply = self
            .dispatch(("Score", &batch, tokens), |worker| {
                let mut call = tonic::Request::new(ScoreRequest {
                    batch: Some(batch.clone()),
                    activate: true,
                });
                call.set_timeout(timeout);
                trace::inject(&mut call);
                async move { worker.client().score(call).await }
            })
            .await?
            .into_inner();
        floats(&reply.scores, reply.count as usize, 1, count)
    }

    /// One chunk's label scores (the Classify RPC), row-major, and the labels a row.
    pub async fn classify(
        &self,
        batch: TokenBatch,
        activate: bool,
        tokens: usize,
        timeout: Duration,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        let count = batch.lengths.len() / 4;
        let reply = self
            .dispatch(("Classify", &batch, tokens), |worker| {
                let mut call = tonic::Request::new(ClassifyRequest {
                    batch: Some(batch.clone()),
                    activate,
                });
                call.set_timeout(timeout);
                trace::inject(&mut call);
                async move { worker.client().classify(call).await }
            })
            .await?
            .into_inner();
        let labels = reply.labels as usize;
        Ok((
            floats(&reply.scores, reply.count as usize, labels, count)?,
            labels,
        ))
    }

    /// One chunk's sparse vectors (the SparseEmbed RPC): each row's ascending vocabulary ids
    /// and their weights.
    pub async fn sparse_embed(
        &self,
        batch: TokenBatch,
        top_k: u32,
        threshold: f32,
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<SparseRow>, ApiError> {
        let count = batch.lengths.len() / 4;
        let reply = self
            .dispatch(("SparseEmbed", &batch, tokens), |worker| {
                let mut call = tonic::Request::new(SparseEmbedRequest {
                    batch: Some(batch.clone()),
                    top_k,
                    threshold,
                });
                call.set_timeout(timeout);
                trace::inject(&mut call);
                async move { worker.client().sparse_embed(call).await }
            })
            .await?
            .into_inner();
        sparse_rows(&reply, count)
    }
}

/// One sparse vector: its ascending vocabulary ids and their weights.
pub type SparseRow = (Vec<i32>, Vec<f32>);

/// A SparseEmbedResponse's rows, checked as the Python gateway's codec checks them (a broken
/// reply is a 500).
fn sparse_rows(
    reply: &crate::proto::SparseEmbedResponse,
    expected: usize,
) -> Result<Vec<SparseRow>, ApiError> {
    let ints = |b: &[u8]| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (bounds, ids) = (ints(&reply.offsets), ints(&reply.indices));
    let weights = floats(&reply.values, ids.len(), 1, ids.len())?;
    let count = reply.count as usize;
    let ordered = bounds.windows(2).all(|w| w[0] <= w[1])
        && bounds.first() == Some(&0)
        && bounds.last().map(|&b| b as usize) == Some(ids.len());
    if bounds.len() != count + 1 || count != expected || !(ordered || count == 0) {
        return Err(broken_reply(
            "a worker's sparse rows do not match their offsets",
        ));
    }
    Ok(bounds
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            (ids[a..b].to_vec(), weights[a..b].to_vec())
        })
        .collect())
}

/// One line per 10 s: a broken worker would answer every request so.
/// One line per 10 s: a failing worker fails every call sent to it.
static FAILED_CALL_LOG: crate::logs::Limiter =
    crate::logs::Limiter::new(std::time::Duration::from_secs(10));

pub static BROKEN_REPLY_LOG: crate::logs::Limiter =
    crate::logs::Limiter::new(Duration::from_secs(10));

/// The 500 of a reply that breaks the workers' contract (the Python gateway's codec error),
/// logged at most once per 10 s.
pub fn broken_reply(what: &str) -> ApiError {
    if let Some(held) = BROKEN_REPLY_LOG.allow(Instant::now()) {
        crate::log!(Error, what, "suppressed" => held);
    }
    errors::internal()
}

/// `rows` x `cols` little-endian float32s of a reply, which must be `expected` rows (else the
/// worker broke the contract: a 500, as the Python gateway's codec error).
pub fn floats(
    data: &[u8],
    rows: usize,
    cols: usize,
    expected: usize,
) -> Result<Vec<f32>, ApiError> {
    if data.len() != rows * cols * 4 || rows != expected {
        return Err(broken_reply("a worker answered the wrong number of bytes"));
    }
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_own_timeout_is_a_deadline_and_not_retried() {
        let timed_out = deadline_as_such(Status::from_error(Box::new(tonic::TimeoutExpired(()))));
        assert_eq!(timed_out.code(), Code::DeadlineExceeded);
        assert!(!retryable(&timed_out));
        // A cancel from anywhere else stays one (and is retried).
        let other = deadline_as_such(Status::cancelled("client went away"));
        assert_eq!(other.code(), Code::Cancelled);
        assert!(retryable(&other));
    }

    #[test]
    fn capacity_counts_unmeasured_workers_at_the_mean() {
        assert_eq!(fleet_capacity(&[]), 0.0);
        assert_eq!(fleet_capacity(&[0.0, 0.0]), 0.0);
        assert_eq!(fleet_capacity(&[100.0, 0.0]), 200.0);
    }

    #[test]
    fn failures_map_to_the_python_statuses() {
        let e = client_error(&Status::unavailable("x"), 1);
        assert_eq!(
            (e.status, e.message.as_str()),
            (502, "A worker failed (UNAVAILABLE).")
        );
        assert_eq!(
            client_error(&Status::resource_exhausted("x"), 3).status,
            429
        );
        assert_eq!(client_error(&Status::deadline_exceeded("x"), 1).status, 504);
        assert_eq!(client_error(&Status::invalid_argument("no"), 1).status, 400);
        assert!(retryable(&Status::cancelled("")) && !ejects(&Status::cancelled("")));
        assert!(ejects(&Status::internal("Received RST_STREAM")));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hung_signal_reaches_only_leases_taken_before_it() {
        let hung = Arc::new(Hung::new(()));
        let mut before = hung.subscribe();
        hung.send_replace(());
        let mut after = hung.subscribe();
        let soon = Duration::from_millis(50);
        assert!(tokio::time::timeout(soon, found_hung(&mut before))
            .await
            .is_ok());
        assert!(tokio::time::timeout(soon, found_hung(&mut after))
            .await
            .is_err());
        drop(hung); // the worker removed: its calls in flight are left to finish
        assert!(tokio::time::timeout(soon, found_hung(&mut after))
            .await
            .is_err());
        let s = stopped_answering();
        assert!(retryable(&s) && ejects(&s));
    }

    #[test]
    fn half_floats_decode() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(half_to_f32(0x3555), 0.33325195);
    }

    #[test]
    fn packing_is_little_endian_int32() {
        let b = pack(&[vec![1, 2], vec![3]]);
        assert_eq!(b.lengths, [2, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(b.token_ids.len(), 12);
        assert_eq!(&b.token_ids[8..], [3, 0, 0, 0]);
    }
}

impl crate::admission::Fleet for Pool {
    fn queued_elsewhere(&self) -> f64 {
        Pool::queued_elsewhere(self) as f64
    }

    fn capacity(&self) -> f64 {
        self.usable().1
    }
}
