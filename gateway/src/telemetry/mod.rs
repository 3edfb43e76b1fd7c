//! What the gateway tells its operators: Prometheus metrics, JSON-lines logs, OpenTelemetry
//! traces.

pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod traces;
