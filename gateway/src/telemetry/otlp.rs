//! The OTLP trace messages and the collector's client (build.rs compiles proto/otlp_trace.proto),
//! and the channel to a collector: `http://` plaintext, `https://` TLS with the system's roots,
//! as OpenTelemetry's exporters read the endpoint.
#![allow(clippy::all, clippy::pedantic)]
tonic::include_proto!("opentelemetry.proto.collector.trace.v1");

pub use trace_service_client::TraceServiceClient;

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// A lazily connected channel to the collector at `endpoint` (refused at start if unusable).
pub fn channel(endpoint: &str) -> Result<Channel, String> {
    let bad = |e: &dyn std::fmt::Display| format!("--tracing-endpoint {endpoint:?}: {e}");
    let mut target = Endpoint::from_shared(endpoint.to_string()).map_err(|e| bad(&e))?;
    if endpoint.starts_with("https://") {
        target = target
            .tls_config(ClientTlsConfig::new().with_native_roots())
            .map_err(|e| bad(&e))?;
    } else if !endpoint.starts_with("http://") {
        return Err(bad(&"use http:// (plaintext) or https:// (TLS)"));
    }
    Ok(target.connect_lazy())
}
