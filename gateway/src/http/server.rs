//! The server: the accept loop, the connection cap, each connection served by hyper under its
//! bounds, and a graceful stop (no new connections; those open finish their request).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::http::auth::KeyFile;
use crate::http::connection::{self, Bounds, Watch, Watched};
use crate::http::routes::{self, Router};
use crate::telemetry::logs::Limiter;
use crate::upstream::discovery;

/// One line per 10 s: a failing accept fails again at the rate connections arrive.
static ACCEPT_LOG: Limiter = Limiter::new(Duration::from_secs(10));

/// The open connections, counted against --max-connections; `closed` wakes the stop's wait
/// when the last one ends (a permit kept if nobody waits yet, so the wake is never lost).
#[derive(Default)]
struct Connections {
    count: AtomicU64,
    closed: tokio::sync::Notify,
}

/// One open connection, counted in Connections until its task ends.
struct Opened(Arc<Connections>);

impl Drop for Opened {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_one();
        }
    }
}

/// Serves until SIGTERM or Ctrl-C, then lets open connections finish their requests for up to
/// a worker call's deadline (a pod's grace period covers it).
pub async fn serve(router: Arc<Router>, keys: Option<Arc<KeyFile>>) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    // Before anything can announce the gateway: as a container's PID 1 a signal without a
    // handler is ignored, so a SIGTERM right after "listening" would otherwise be lost.
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let gateway = Arc::clone(&router.gateway);
    let s = &gateway.settings;
    let addr: SocketAddr = format!("{}:{}", s.host, s.port)
        .parse()
        .map_err(|e| format!("--host/--port: {e}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    for served in &gateway.served {
        // Each model's workers, by its own settings (a models file's entry names them).
        discovery::start(&served.pool, &served.settings);
    }
    if let Some(keys) = &keys {
        keys.start();
    }
    let open_files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| connection::open_files_limit(&t))
        .unwrap_or(1024);
    let cap = connection::connection_cap(s.max_connections, open_files);
    if cap < s.max_connections {
        tracing::warn!(
            max_connections = cap,
            open_files,
            "max connections lowered to fit the open-file limit"
        );
    }
    let open = Arc::new(Connections::default());
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!("embedfleet-gateway listening on http://{bound}");
    // Set once a stop is asked: each connection finishes the request it is serving, then closes.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and the like: at the rate connections arrive.
                    if let Some(held) = ACCEPT_LOG.allow(Instant::now()) {
                        tracing::error!(error = %e, suppressed = held, "accept failed");
                    }
                    continue;
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        };
        if open.count.fetch_add(1, Ordering::AcqRel) >= cap {
            // Refused before any work: a write the socket's empty buffer takes whole, then close.
            open.count.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.try_write(connection::too_many());
            continue;
        }
        let opened = Opened(Arc::clone(&open));
        tokio::spawn(one(Arc::clone(&router), stream, opened, stopping.clone()));
    }
    drop(listener);
    let _ = stop.send(true);
    let grace = Duration::from_secs_f64(s.upstream_timeout_seconds.ceil());
    let left = open.count.load(Ordering::Acquire);
    if left > 0 {
        tracing::info!(
            connections = left,
            "stopping: open connections finish their requests"
        );
    }
    let drained = async {
        while open.count.load(Ordering::Acquire) > 0 {
            open.closed.notified().await;
        }
    };
    let _ = tokio::time::timeout(grace, drained).await;
    Ok(())
}

/// One connection, served until it closes, a bound ends it, or the server stops.
async fn one(
    router: Arc<Router>,
    stream: TcpStream,
    _opened: Opened,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let s = &router.gateway.settings;
    let _ = stream.set_nodelay(true);
    let bounds = Bounds::drawn(
        s.header_timeout_seconds,
        s.keep_alive_seconds,
        fastrand::f64(),
    );
    let close_after = connection::close_after(
        Instant::now(),
        s.max_connection_age_seconds,
        fastrand::f64(),
    );
    let limits = (s.max_header_bytes, s.max_headers);
    let watch = Watch::new();
    let busy = Arc::clone(&watch);
    let handler_router = Arc::clone(&router);
    let handler = service_fn(move |req| {
        // Synchronously, before hyper reads on: from here the header bound is off.
        let guard = busy.busy();
        let reply = routes::handle(Arc::clone(&handler_router), req);
        let stopping = stopping.clone();
        async move {
            let mut reply = reply.await;
            drop(guard);
            if let Ok(answer) = reply.as_mut() {
                let close_after = if *stopping.borrow() {
                    Some(Instant::now())
                } else {
                    close_after
                };
                connection::age_out(answer.headers_mut(), close_after);
            }
            reply
        }
    });
    let io = TokioIo::new(Watched::new(stream, Arc::clone(&watch), limits));
    let conn = http1::Builder::new()
        .keep_alive(true)
        .max_header_size(limits.0)
        .max_headers(limits.1)
        .serve_connection(io, handler);
    // Once a stop is asked the connection serves on, each response saying `Connection: close`
    // (its client then never sends on a closing socket); an idle one closes at its keep-alive
    // bound. Closing idle connections at once raced the clients' next requests: one sent as the
    // close crossed it was lost, a connection error no client retries for a POST.
    watch.guard(bounds, conn).await;
}
