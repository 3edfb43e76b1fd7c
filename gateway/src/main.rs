//! embedfleet-gateway: settings in, the gateway served until SIGTERM.

use std::io::IsTerminal;
use std::sync::Arc;

use embedfleet_gateway::app::build;
use embedfleet_gateway::http::auth::KeyFile;
use embedfleet_gateway::http::routes::Router;
use embedfleet_gateway::http::server;
use embedfleet_gateway::settings::{LogFormat, Refused, Settings};
use embedfleet_gateway::telemetry::logs;

// Measured: glibc malloc was ~18% of this process's CPU at 1x20 x16 (tokenizer and HTTP buffers
// allocated and freed per request); mimalloc's thread-local free lists take most of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn fail(message: &str) -> ! {
    eprintln!("embedfleet-gateway: {message}");
    std::process::exit(2);
}

fn main() {
    let settings = match Settings::from_args(std::env::args_os()) {
        Ok(s) => s,
        Err(Refused::Help(text)) => {
            print!("{text}");
            return;
        }
        Err(Refused::Bad(line)) => fail(&line),
    };
    let json = match settings.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    logs::init(logs::level(&settings.log_level), json);
    // One event loop: at ~20 tokens a query the work per request is microseconds, and
    // cross-thread wake-ups would cost more CPU than a second core saves. Large tokenizations
    // go to the blocking pool: the tokenizer threads, and one more for the large lane.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(settings.tokenize_threads.max(1) + 1)
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let served = runtime.block_on(async {
        let keys = match settings.api_keys_file.as_str() {
            "" => None,
            path => Some(Arc::new(KeyFile::open(
                path,
                settings.api_keys_reload_seconds,
            )?)),
        };
        let gateway = Arc::new(build::gateway(settings)?);
        let router = Arc::new(Router::new(Arc::clone(&gateway), keys.clone()));
        let served = server::serve(router, keys).await;
        // Stopping: what spans are queued go out first.
        gateway.tracer.shutdown().await;
        served
    });
    if let Err(e) = served {
        fail(&e);
    }
}
