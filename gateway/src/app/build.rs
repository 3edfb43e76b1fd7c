//! The gateway from its settings: one served model, or each of `--models-file`'s, with its
//! tokenizer, workers, admission and hold; the tracer they share.

use std::sync::Arc;

use crate::app::gateway::Gateway;
use crate::app::service::Service;
use crate::model::{catalog, dir, quantization};
use crate::plan::admission::{Admission, Fleet};
use crate::plan::hold::Hold;
use crate::plan::tokenize::Tokenization;
use crate::settings::Settings;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::traces::{self, Tracer};
use crate::upstream::pool::{self, Coalescing, Pool};

/// The process (within the runtime: the tracer's exporter and the workers' channels spawn
/// tasks on it).
pub fn gateway(s: Settings) -> Result<Gateway, String> {
    let env = traces::process_env();
    let config = traces::config(
        &s.tracing_endpoint,
        &s.tracing_service_name,
        s.tracing_sample_ratio,
        &env,
    )?;
    let tracer = match config {
        Some(config) => Tracer::start(&config, &env)?,
        None => Tracer::off(),
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let shared = !s.models_file.is_empty();
    let metrics = Arc::new(Metrics::new(shared));
    let mut served = Vec::new();
    if shared {
        let text = std::fs::read_to_string(&s.models_file)
            .map_err(|e| format!("--models-file {}: {e}", s.models_file))?;
        for (i, each) in catalog::parse_models(&text, &s)?.into_iter().enumerate() {
            let model = service(each, &metrics, &tracer, created)
                .map_err(|e| format!("models[{i}]: {e}"))?;
            served.push(Arc::new(model));
        }
    } else {
        served.push(Arc::new(service(s.clone(), &metrics, &tracer, created)?));
    }
    Gateway::new(s, served, metrics, tracer)
}

/// One served model.
fn service(
    s: Settings,
    metrics: &Metrics,
    tracer: &Tracer,
    created: u64,
) -> Result<Service, String> {
    let model = dir::load(&s.model, &s.task)?;
    let max_tokens = model.max_input_tokens(s.max_input_tokens)?;
    let tokenization = Tokenization::new(&model, max_tokens)?;
    let coalescing = Coalescing {
        max_inflight: s.coalesce_inflight,
        max_tokens: s.chunk_tokens,
        max_sequences: s.chunk_sequences,
        // Traced, each small call carries its own traceparent: unary calls.
        stream: s.coalesce_stream && !tracer.enabled(),
    };
    let name = if s.served_model_name.is_empty() {
        model.name.clone()
    } else {
        s.served_model_name.clone()
    };
    // Leaked once per served model: requests name it for the process's life.
    let name: &'static str = Box::leak(name.into_boxed_str());
    let metrics = Arc::new(metrics.model(name));
    for address in &s.workers.0 {
        pool::target(address).map_err(|e| format!("--workers: {e}"))?;
    }
    let pool = Pool::new(
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
        model.name == dir::DEFAULT_MODEL_NAME,
    )?;
    let specials = (tokenization.specials(), tokenization.pair_specials());
    let admission = Arc::new(Admission::new(
        max_tokens,
        specials,
        s.max_queue_seconds,
        s.retry_after_seconds,
        Arc::clone(&pool) as Arc<dyn Fleet>,
        metrics.shed.clone(),
    ));
    let hold = Hold::new(
        Arc::clone(&pool),
        Arc::clone(&metrics),
        s.hold_requests,
        s.hold_seconds,
        s.retry_after_seconds,
    );
    Ok(Service {
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
