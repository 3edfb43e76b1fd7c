//! The server's life once the engine is warm: listen, serve, and on SIGTERM, SIGINT or
//! `Server.stop` drain: health NOT_SERVING and new calls UNAVAILABLE, every queued or computing
//! call answered (up to --drain-seconds), open EmbedStreams ended, then the server stops and
//! `serve` returns.
use std::net::TcpListener as StdListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Notify};
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::connections;
use crate::generated::worker_server::WorkerServer;
use crate::limits::Limits;
use crate::pb;
use crate::queue::Queue;
use crate::service::Front;
use crate::stats::Stats;

const SERVICE: &str = "embedfleet.v1.Worker";
/// Replies: the largest is a full request's vectors, far from this (as lifecycle.py's).
const MAX_REPLY_BYTES: usize = 256 << 20;
/// How long the server may take to close its connections once the drain is done.
const GRACE: Duration = Duration::from_secs(1);

pub struct Config {
    pub host: String,
    pub port: u16,
    pub max_message_bytes: usize,
    pub drain_seconds: f64,
    /// Tracing is on: unary calls carry their trace context to the Python side.
    pub traced: bool,
}

/// What the server shares with the engine thread and the Python side.
pub struct Parts {
    pub queue: Arc<Queue>,
    pub limits: Arc<Limits>,
    pub stats: Arc<Stats>,
    /// Info's fixed fields.
    pub info: pb::InfoResponse,
    /// Called with the bound port once listening (the Python side's port file and log line).
    pub on_listening: Py<PyAny>,
    /// Drain as on SIGTERM when notified (`Server.stop`).
    pub stop: Arc<Notify>,
}

/// Serve on the calling thread (a current-thread runtime) until SIGTERM and the drain.
pub fn run(config: Config, parts: Parts) -> PyResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(config, parts))
}

async fn serve(config: Config, parts: Parts) -> PyResult<()> {
    let Parts {
        queue,
        limits,
        stats,
        info,
        on_listening,
        stop,
    } = parts;
    // Bound here: a taken port is the caller's OSError, told in one line.
    let listener = StdListener::bind((config.host.as_str(), config.port))?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let (mut health, health_service) = tonic_health::server::health_reporter();
    for name in ["", SERVICE] {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let (close, closing) = watch::channel(false);
    let front = Front {
        queue,
        limits: Arc::clone(&limits),
        stats: Arc::clone(&stats),
        info: Arc::new(info),
        closing: closing.clone(),
        traced: config.traced,
    };
    let worker = WorkerServer::new(front)
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(MAX_REPLY_BYTES);
    let routes = Routes::new(health_service).add_service(worker);
    let server = tokio::spawn(connections::serve(
        listener,
        routes,
        closing,
        Arc::clone(&stats),
    ));
    stats.set_listening();
    Python::with_gil(|py| on_listening.call1(py, (port,)))?;
    tracing::info!(port, "listening");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        () = stop.notified() => tracing::info!("stopping: asked by the engine's side"),
    }
    drain(&config, &limits, &mut health).await;
    // Open EmbedStreams stop reading and end once answered; connections get GOAWAY.
    let _ = close.send(true);
    if tokio::time::timeout(GRACE, server).await.is_err() {
        tracing::warn!("connections still open after the grace period");
    }
    Ok(())
}

async fn drain(
    config: &Config,
    limits: &Limits,
    health: &mut tonic_health::server::HealthReporter,
) {
    limits.start_draining();
    for name in ["", SERVICE] {
        health
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    tracing::info!(inflight = limits.inflight(), "draining");
    let deadline = Instant::now() + Duration::from_secs_f64(config.drain_seconds.max(0.0));
    while limits.inflight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if limits.inflight() > 0 {
        tracing::warn!(inflight = limits.inflight(), "drain timed out");
    }
}
