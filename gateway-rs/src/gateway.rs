//! The process: its served models (one, or a models file's several), which of them a request
//! names, and what the process answers for all of them (/ready, /metrics, /v1/models).

use std::sync::Arc;

use crate::auth::KeyFile;
use crate::catalog::Catalog;
use crate::errors::ApiError;
use crate::metrics::{Metrics, Part, Scrape};
use crate::service::Service;
use crate::settings::Settings;
use crate::trace::Tracer;

pub struct Gateway {
    /// the process's settings (the HTTP server, auth, tracing, request limits)
    pub settings: Settings,
    /// each served model, in the catalog's order
    pub served: Vec<Arc<Service>>,
    catalog: Catalog,
    /// the process's metrics; with one model, that model's too
    pub metrics: Arc<Metrics>,
    /// The API keys file, when /v1/* needs a key (--api-keys-file).
    pub keys: Option<Arc<KeyFile>>,
    /// OpenTelemetry spans of requests (trace.rs); off without an endpoint.
    pub tracer: Tracer,
}

impl Gateway {
    pub fn new(
        settings: Settings,
        served: Vec<Arc<Service>>,
        metrics: Arc<Metrics>,
        keys: Option<Arc<KeyFile>>,
        tracer: Tracer,
    ) -> Result<Gateway, String> {
        let catalog = Catalog::of(served.iter().map(|s| s.name.to_string()).collect())?;
        Ok(Gateway {
            settings,
            served,
            catalog,
            metrics,
            keys,
            tracer,
        })
    }

    /// The model a request's `model` names (catalog.rs); else the 400 or 404 to answer.
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

    pub fn exposition(&self) -> String {
        let parts: Vec<Part> = self
            .served
            .iter()
            .map(|s| Part {
                metrics: &s.metrics,
                workers: s.pool.worker_states(),
                scrape: Scrape::of(&s.admission, &s.hold),
            })
            .collect();
        self.metrics.exposition(&parts)
    }
}
