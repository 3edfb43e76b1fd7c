//! embedfleet-gateway-rs: the embedfleet gateway in Rust (issue #20), one model or a models
//! file's several. The Python gateway stays the reference; tests/gateway_rs checks this one
//! against it request by request.

mod admission;
mod auth;
mod balancer;
mod catalog;
mod coalescing;
mod connection;
mod discovery;
mod errors;
mod gateway;
mod hold;
mod http;
mod kube;
mod logs;
mod metrics;
mod model;
mod otlp;
mod pool;
mod proto;
mod quantization;
mod request;
mod service;
mod settings;
mod splitting;
mod stream;
mod tokenization;
mod trace;
mod windows;
mod wordpiece;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// One line per 10 s: a failing accept fails again at the rate connections arrive.
static ACCEPT_LOG: crate::logs::Limiter =
    crate::logs::Limiter::new(std::time::Duration::from_secs(10));

// Measured: glibc malloc was ~18% of this process's CPU at 1x20 x16 (tokenizer and HTTP buffers
// allocated and freed per request); mimalloc's thread-local free lists take most of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn fail(message: String) -> ! {
    eprintln!("embedfleet-gateway-rs: {message}");
    std::process::exit(2);
}

/// The process: one model from the settings, or each of `--models-file`'s.
fn build(s: settings::Settings) -> Result<gateway::Gateway, String> {
    let env = trace::process_env();
    let tracer = match trace::config(
        &s.tracing_endpoint,
        &s.tracing_service_name,
        s.tracing_sample_ratio,
        &env,
    )? {
        Some(config) => trace::Tracer::start(&config, &env)?,
        None => trace::Tracer::off(),
    };
    let keys = if s.api_keys_file.is_empty() {
        None
    } else {
        Some(Arc::new(auth::KeyFile::open(
            &s.api_keys_file,
            s.api_keys_reload_seconds,
        )?))
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (served, metrics) = if s.models_file.is_empty() {
        let one = Arc::new(build_model(s.clone(), None, &tracer, created)?);
        let metrics = Arc::clone(&one.metrics);
        (vec![one], metrics)
    } else {
        let text = std::fs::read_to_string(&s.models_file)
            .map_err(|e| format!("--models-file {}: {e}", s.models_file))?;
        let mut served = Vec::new();
        for (i, each) in catalog::parse_models(&text, &s)?.into_iter().enumerate() {
            let model = build_model(each, Some(i), &tracer, created)
                .map_err(|e| format!("models[{i}]: {e}"))?;
            served.push(Arc::new(model));
        }
        (served, Arc::new(metrics::Metrics::shared()))
    };
    gateway::Gateway::new(s, served, metrics, keys, tracer)
}

/// One served model; `entry` is its index in a models file (its metrics then carry its name).
fn build_model(
    s: settings::Settings,
    entry: Option<usize>,
    tracer: &trace::Tracer,
    created: u64,
) -> Result<service::Service, String> {
    let model = model::load(&s.model, &s.task)?;
    let max_tokens = model.max_input_tokens(s.max_input_tokens)?;
    let tokenization = tokenization::Tokenization::new(&model, max_tokens)?;
    let coalescing = pool::Coalescing {
        max_inflight: s.coalesce_inflight,
        max_tokens: s.chunk_tokens,
        max_sequences: s.chunk_sequences,
        small_tokens: s.min_chunk_tokens,
        // Traced, each small call carries its own traceparent: unary calls (stream.rs).
        stream: s.coalesce_stream && !tracer.enabled(),
    };
    let name = if s.served_model_name.is_empty() {
        model.name.clone()
    } else {
        s.served_model_name.clone()
    };
    // Leaked once per served model: the request metrics key on the name for the process's life.
    let name: &'static str = Box::leak(name.into_boxed_str());
    let metrics = Arc::new(match entry {
        Some(_) => metrics::Metrics::for_model(name),
        None => metrics::Metrics::default(),
    });
    for address in &s.workers {
        pool::target(address).map_err(|e| format!("--workers: {e}"))?;
    }
    let pool = pool::Pool::new(
        s.eject_seconds,
        s.probe_seconds,
        s.retry_after_seconds,
        coalescing,
        Arc::clone(&metrics),
        tracer.clone(),
    );
    let calibration = quantization::find_calibration(
        &s.quantization_file,
        &model.path,
        model.name == model::DEFAULT_MODEL_NAME,
    )?;
    let specials = (tokenization.specials(), tokenization.pair_specials());
    let admission = Arc::new(admission::Admission::new(
        max_tokens,
        specials,
        s.max_queue_seconds,
        s.retry_after_seconds,
        Arc::clone(&pool) as Arc<dyn admission::Fleet>,
    ));
    let hold = hold::Hold::new(
        Arc::clone(&pool),
        Arc::clone(&metrics),
        s.hold_requests,
        s.hold_seconds,
        s.retry_after_seconds,
    );
    Ok(service::Service {
        settings: s,
        model,
        name,
        tokenization: Arc::new(tokenization),
        pool,
        metrics,
        admission,
        hold,
        large_lane: tokio::sync::Semaphore::new(1),
        calibration,
        created,
        tracer: tracer.clone(),
    })
}

async fn serve(gateway: Arc<gateway::Gateway>) -> Result<(), String> {
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
    if let Some(keys) = &gateway.keys {
        keys.start();
    }
    let open_files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| connection::open_files_limit(&t))
        .unwrap_or(1024);
    let cap = connection::connection_cap(s.max_connections, open_files);
    if cap < s.max_connections {
        crate::log!(
            Warning,
            "max connections lowered to fit the open-file limit",
            "max_connections" => cap,
            "open_files" => open_files,
        );
    }
    let open = Arc::new(Connections::default());
    let mut rng = balancer::Rng::seeded();
    crate::log!(
        Info,
        format!("embedfleet-gateway-rs listening on http://{addr}")
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    // Set once a stop is asked: each connection finishes the request it is serving, then closes.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and the like: at the rate connections arrive.
                    if let Some(held) = ACCEPT_LOG.allow(std::time::Instant::now()) {
                        crate::log!(Error, "accept failed", "error" => e.to_string(), "suppressed" => held);
                    }
                    continue;
                }
            },
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        if open.count.fetch_add(1, Ordering::AcqRel) >= cap {
            // Refused before any work: a write the socket's empty buffer takes whole, then close.
            open.count.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.try_write(connection::too_many());
            continue;
        }
        let _ = stream.set_nodelay(true);
        let gateway = Arc::clone(&gateway);
        let open = Opened(Arc::clone(&open));
        let bounds =
            connection::Bounds::drawn(s.header_timeout_seconds, s.keep_alive_seconds, rng.unit());
        let close_after = connection::close_after(
            std::time::Instant::now(),
            s.max_connection_age_seconds,
            rng.unit(),
        );
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            let _open = open;
            let watch = connection::Watch::new();
            let busy = Arc::clone(&watch);
            let handler = service_fn(move |req| {
                // Synchronously, before hyper reads on: from here the header bound is off.
                let guard = busy.busy();
                let reply = http::handle(Arc::clone(&gateway), req);
                async move {
                    let mut reply = reply.await;
                    drop(guard);
                    if let Ok(answer) = reply.as_mut() {
                        connection::age_out(answer.headers_mut(), close_after);
                    }
                    reply
                }
            });
            let io = TokioIo::new(connection::Watched::new(stream, Arc::clone(&watch)));
            let conn = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, handler);
            let served = async move {
                tokio::pin!(conn);
                // The flag's read guard is not Send: dropped before the connection is awaited on.
                let stop_asked = async move {
                    let _ = stopping.wait_for(|stop| *stop).await.is_ok();
                };
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = stop_asked => {
                        // An idle connection closes now; a busy one after its response.
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            };
            watch.guard(bounds, served).await;
        });
    }
    // As the Python gateway (uvicorn's graceful shutdown): no new connections, and the requests
    // in flight get up to a call's deadline to be answered; a pod's grace period covers it.
    drop(listener);
    let _ = stop.send(true);
    let grace = std::time::Duration::from_secs_f64(s.upstream_timeout_seconds.ceil());
    let left = open.count.load(Ordering::Acquire);
    if left > 0 {
        crate::log!(Info, "stopping: open connections finish their requests", "connections" => left);
    }
    let drained = async {
        while open.count.load(Ordering::Acquire) > 0 {
            open.closed.notified().await;
        }
    };
    let _ = tokio::time::timeout(grace, drained).await;
    Ok(())
}

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        // Asked for: on stdout, and a success (as argparse answers the Python gateway's).
        println!("{}", settings::help());
        return;
    }
    let settings = settings::load(&args, std::env::vars()).unwrap_or_else(|e| fail(e));
    logs::set_level(logs::Level::parse(&settings.log_level));
    // One event loop, as the Python gateway runs: at ~20 tokens a query the work per request is
    // microseconds, and cross-thread wake-ups would cost more CPU than a second core saves.
    // Large tokenizations go to the blocking pool (service.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The tokenizer threads, and one more for the large lane (service.rs `tokenized`).
        .max_blocking_threads(settings.tokenize_threads.max(1) + 1)
        .build()
        .unwrap_or_else(|e| fail(e.to_string()));
    // Inside the runtime: the workers' channels spawn their tasks on it.
    let served = runtime.block_on(async {
        let gateway = Arc::new(build(settings)?);
        let served = serve(Arc::clone(&gateway)).await;
        // Stopping: what spans are queued go out first.
        gateway.tracer.shutdown().await;
        served
    });
    if let Err(e) = served {
        fail(e);
    }
}
