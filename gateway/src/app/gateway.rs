//! The process: its served models (one, or a models file's several), which of them a request
//! names, and what the process answers for all of them (/ready, /metrics, /v1/models).

use std::sync::Arc;

use crate::api::errors::ApiError;
use crate::app::service::Service;
use crate::model::catalog::Catalog;
use crate::settings::Settings;
use crate::telemetry::metrics::{Metrics, Scrape};
use crate::telemetry::traces::Tracer;

pub struct Gateway {
    /// the process's settings (the HTTP server, auth, tracing, request limits)
    pub settings: Settings,
    /// each served model, in the catalog's order
    pub served: Vec<Arc<Service>>,
    catalog: Catalog,
    pub metrics: Arc<Metrics>,
    /// OpenTelemetry spans of requests; off without an endpoint.
    pub tracer: Tracer,
}

impl Gateway {
    pub fn new(
        settings: Settings,
        served: Vec<Arc<Service>>,
        metrics: Arc<Metrics>,
        tracer: Tracer,
    ) -> Result<Gateway, String> {
        let catalog = Catalog::of(served.iter().map(|s| s.name.to_string()).collect())?;
        Ok(Gateway {
            settings,
            served,
            catalog,
            metrics,
            tracer,
        })
    }

    /// The model a request's `model` names; else the 400 or 404 to answer.
    pub fn pick(&self, requested: Option<&str>) -> Result<&Service, ApiError> {
        Ok(&self.served[self.catalog.pick(requested)?])
    }

    /// Ready while any model can answer: has a ready worker, or holds requests until one is
    /// (scale from zero).
    pub fn ready(&self) -> bool {
        self.served
            .iter()
            .any(|s| s.hold.keeps_ready() || s.pool.ready())
    }

    /// /v1/models: every served model.
    pub fn models(&self) -> Vec<u8> {
        let entries: Vec<String> = self.served.iter().map(|s| s.model_entry()).collect();
        format!(r#"{{"object":"list","data":[{}]}}"#, entries.join(",")).into_bytes()
    }

    /// /metrics: the registry, with each model's figures read now.
    pub fn exposition(&self) -> Vec<u8> {
        let models: Vec<_> = self
            .served
            .iter()
            .map(|s| {
                let scrape = Scrape {
                    queued_seconds: s.admission.queued_seconds(),
                    delivered: s.admission.delivered(),
                    held: s.hold.held.load(std::sync::atomic::Ordering::Relaxed),
                    held_tokens: s
                        .hold
                        .held_tokens
                        .load(std::sync::atomic::Ordering::Relaxed),
                };
                (s.metrics.as_ref(), scrape, s.pool.worker_states())
            })
            .collect();
        self.metrics.exposition(&models)
    }
}
