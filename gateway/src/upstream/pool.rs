//! The live workers: one tonic channel each, probed with Info for readiness and capacity, the
//! set changed live by discovery (`update`), and chunks dispatched to them with one retry
//! elsewhere for a failure that says the worker never ran the chunk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint as Target};
use tonic::{Code, Status};

use prost::Message as _;

use crate::api::errors::ApiError;
use crate::telemetry::logs::Limiter;
use crate::telemetry::metrics::{ModelMetrics, WorkerState};
use crate::telemetry::traces::{self, Span, Tracer};
use crate::upstream::balancer::Balancer;
use crate::upstream::batch::{
    floats, hybrid_rows, sparse_rows, token_vectors, HybridRow, SparseRow, TokenVectors,
};
use crate::upstream::coalescing::Coalescer;
use crate::upstream::failure::{
    client_error, code_name, deadline_as_such, ejects, retryable, stopped_answering,
};
use crate::upstream::proto::worker_client::WorkerClient;
use crate::upstream::proto::{
    ClassifyRequest, FloatFormat, HybridEmbedRequest, InfoRequest, InfoResponse,
    MultiVectorEmbedRequest, ScoreRequest, SparseEmbedRequest, TokenBatch,
};

const ATTEMPTS: usize = 2;

/// When Embed calls to a worker are merged (coalescing); `max_inflight` 0: never; None: as
/// many as the worker's device wants (`coalescing::inflight_for`, learned from its Info).
#[derive(Debug, Clone, Copy)]
pub struct Coalescing {
    pub max_inflight: Option<usize>,
    pub max_tokens: usize,
    pub max_sequences: usize,
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
    metrics: Arc<ModelMetrics>,
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
    metrics: &'a ModelMetrics,
    done: bool,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled_calls.inc();
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

/// A worker address as a tonic target (http://host:port, IPv6 in brackets).
pub fn target(address: &str) -> Result<Target, String> {
    host_port(address)?;
    Ok(Target::from_shared(format!("http://{address}"))
        .map_err(|err| format!("{address}: {err}"))?
        // Notice a dead peer in seconds rather than waiting on TCP timeouts.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// A worker address is `host:port` with a port a worker can listen on: a bare host or port 0
/// would be a worker that never answers, counted unready for good.
pub fn host_port(address: &str) -> Result<(), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address}: not host:port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !host.is_empty() => Ok(()),
        _ => Err(format!(
            "{address}: not host:port with a port from 1 to 65535"
        )),
    }
}

/// Tokens/s of the usable workers together; one that has not reported a measurement counts
/// at the mean of those that have.
pub fn fleet_capacity(capacities: &[f64]) -> f64 {
    let known: Vec<f64> = capacities.iter().copied().filter(|&c| c > 0.0).collect();
    if known.is_empty() {
        return 0.0;
    }
    known.iter().sum::<f64>() * capacities.len() as f64 / known.len() as f64
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
        metrics: Arc<ModelMetrics>,
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
                    tracing::warn!(error = %e, "worker address skipped");
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
            let names: Vec<&str> = added.iter().map(|e| e.address.as_str()).collect();
            let gone: Vec<&str> = removed.iter().map(|e| e.address.as_str()).collect();
            tracing::info!(added = ?names, removed = ?gone, workers = count, "workers changed");
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
        infos.first().is_none_or(|(_, i)| i.default_normalize)
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
                    tracing::warn!(
                        worker = %e.address,
                        code = code_name(status.code()),
                        "worker not answering",
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
        // A new process behind the address, or a change of readiness.
        if restarted {
            tracing::info!(worker = %e.address, ready = ready, "worker restarted");
        } else if ready != was {
            tracing::info!(worker = %e.address, ready = ready, "worker readiness");
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
            .child(&format!("{SERVICE}/{rpc}"), traces::Kind::Client);
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
        // made under the client span, whose context its metadata carries (traces::inject).
        let called = traces::within(span.context(), async {
            tokio::select! {
                biased;
                called = call(worker) => called.map_err(deadline_as_such),
                () = found_hung(&mut hung) => Err(stopped_answering()),
            }
        })
        .await;
        flight.done = true;
        self.metrics.upstream.observe(start.elapsed().as_secs_f64());
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
                        self.metrics.ejections.inc();
                        let address = b.get_mut(lease.id).map(|e| e.address.clone());
                        tracing::warn!(
                            worker = %address.unwrap_or_default(),
                            code = code_name(status.code()),
                            "worker ejected",
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
                        None => ApiError::NoWorkerLeft {},
                    });
                }
                Err(Failure::Upstream(status)) => {
                    if !retryable(&status) || attempt + 1 == ATTEMPTS {
                        if let Some(held) = FAILED_CALL_LOG.allow(Instant::now()) {
                            // The answer says only the code: the reason is for the operator.
                            tracing::warn!(
                                code = code_name(status.code()),
                                reason = %status.message(),
                                suppressed = held,
                                "worker call failed",
                            );
                        }
                        return Err(client_error(&status, self.retry_after));
                    }
                    if status.code() == Code::ResourceExhausted {
                        busy = Some(status);
                    }
                    self.metrics.retries.inc();
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One chunk's embeddings; a `small` one (a whole small request) is merged with other
    /// small chunks while the worker is busy.
    pub async fn embed(
        &self,
        batch: TokenBatch,
        dims: u32,
        normalize: Option<bool>,
        tokens: usize,
        small: bool,
        timeout: Duration,
    ) -> Result<Vec<f32>, ApiError> {
        self.dispatch(("Embed", &batch, tokens), |worker| {
            let batch = batch.clone();
            async move { worker.embed(batch, dims, normalize, small, timeout).await }
        })
        .await
    }

    /// One unary call of `rpc` with `message` (carrying the chunk's batch) through `send`,
    /// under the call's deadline and trace context.
    async fn unary<M, R, Fut>(
        &self,
        (rpc, batch, tokens): (&'static str, &TokenBatch, usize),
        message: M,
        timeout: Duration,
        send: impl Fn(WorkerClient<Channel>, tonic::Request<M>) -> Fut,
    ) -> Result<R, ApiError>
    where
        M: Clone,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let reply = self
            .dispatch((rpc, batch, tokens), |worker| {
                let mut call = tonic::Request::new(message.clone());
                call.set_timeout(timeout);
                traces::inject(&mut call);
                send(worker.client(), call)
            })
            .await?;
        Ok(reply.into_inner())
    }

    /// One chunk's pair scores (the Score RPC, activated: probabilities or sigmoid scores).
    pub async fn score(
        &self,
        batch: TokenBatch,
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<f32>, ApiError> {
        let count = batch.lengths.len() / 4;
        let message = ScoreRequest {
            batch: Some(batch.clone()),
            activate: true,
        };
        let reply = self
            .unary(
                ("Score", &batch, tokens),
                message,
                timeout,
                |mut c, r| async move { c.score(r).await },
            )
            .await?;
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
        let message = ClassifyRequest {
            batch: Some(batch.clone()),
            activate,
        };
        let reply = self
            .unary(
                ("Classify", &batch, tokens),
                message,
                timeout,
                |mut c, r| async move { c.classify(r).await },
            )
            .await?;
        let labels = reply.labels as usize;
        let rows = floats(&reply.scores, reply.count as usize, labels, count)?;
        Ok((rows, labels))
    }

    /// One chunk's sparse vectors (the SparseEmbed RPC): each row's ascending vocabulary ids
    /// and their weights.
    pub async fn sparse_embed(
        &self,
        batch: TokenBatch,
        (top_k, threshold): (u32, f32),
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<SparseRow>, ApiError> {
        let count = batch.lengths.len() / 4;
        let message = SparseEmbedRequest {
            batch: Some(batch.clone()),
            top_k,
            threshold,
        };
        let reply = self
            .unary(
                ("SparseEmbed", &batch, tokens),
                message,
                timeout,
                |mut c, r| async move { c.sparse_embed(r).await },
            )
            .await?;
        sparse_rows(&reply, count)
    }

    /// One chunk's token vectors (the MultiVectorEmbed RPC). They come as float16: a
    /// vector a token makes these replies the largest, and unit vectors lose nothing a MaxSim
    /// ranking sees at float16's 11 bits.
    pub async fn multi_vector_embed(
        &self,
        batch: TokenBatch,
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<TokenVectors>, ApiError> {
        let count = batch.lengths.len() / 4;
        let message = MultiVectorEmbedRequest {
            batch: Some(batch.clone()),
            format: FloatFormat::Float16 as i32,
        };
        let reply = self
            .unary(
                ("MultiVectorEmbed", &batch, tokens),
                message,
                timeout,
                |mut c, r| async move { c.multi_vector_embed(r).await },
            )
            .await?;
        token_vectors(&reply, count)
    }

    /// One chunk's hybrid outputs (the HybridEmbed RPC), those `wanted` (dense, sparse, token
    /// vectors), from one forward. Float32 on the wire: the dense vectors are served at the
    /// precision /v1/embeddings serves them.
    pub async fn hybrid_embed(
        &self,
        batch: TokenBatch,
        wanted: (bool, bool, bool),
        (top_k, threshold): (u32, f32),
        tokens: usize,
        timeout: Duration,
    ) -> Result<Vec<HybridRow>, ApiError> {
        let count = batch.lengths.len() / 4;
        let message = HybridEmbedRequest {
            batch: Some(batch.clone()),
            dense: wanted.0,
            sparse: wanted.1,
            multi_vector: wanted.2,
            format: FloatFormat::Float32 as i32,
            top_k,
            threshold,
        };
        let reply = self
            .unary(
                ("HybridEmbed", &batch, tokens),
                message,
                timeout,
                |mut c, r| async move { c.hybrid_embed(r).await },
            )
            .await?;
        hybrid_rows(&reply, wanted, count)
    }
}

/// One line per 10 s: a failing worker fails every call sent to it.
static FAILED_CALL_LOG: Limiter = Limiter::new(Duration::from_secs(10));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_address_needs_a_host_and_a_usable_port() {
        for ok in ["10.0.0.1:50051", "worker-0.svc:1", "[::1]:65535"] {
            assert!(host_port(ok).is_ok(), "{ok}");
        }
        for bad in [
            "10.0.0.1",
            "10.0.0.1:0",
            "10.0.0.1:65536",
            ":50051",
            "host:port",
            "",
        ] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capacity_counts_unmeasured_workers_at_the_mean() {
        assert_eq!(fleet_capacity(&[]), 0.0);
        assert_eq!(fleet_capacity(&[0.0, 0.0]), 0.0);
        assert_eq!(fleet_capacity(&[100.0, 0.0]), 200.0);
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
    }
}
