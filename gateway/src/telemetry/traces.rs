//! OpenTelemetry traces (docs/gateway.md, "Tracing"): a SERVER span per API request (continuing the
//! client's W3C `traceparent`), `tokenize` and `compute` under it, and a CLIENT span per worker
//! call whose context travels to the worker in the call's `traceparent` metadata. Off (no endpoint)
//! nothing is made: `Tracer::off()` is a `None` and every span an empty value.
//!
//! No SDK: spans are plain records, sampled as OpenTelemetry's ParentBased(TraceIdRatioBased)
//! sampler does, kept in a bounded queue and exported in batches over OTLP/gRPC (the messages of
//! proto/otlp_trace.proto) by one background task, with the batch processor's OTEL_BSP_* settings
//! and OTEL_RESOURCE_ATTRIBUTES honoured as OpenTelemetry's SDKs honour them. The SDK crates
//! (opentelemetry-otlp, tracing-opentelemetry) measured +40% CPU on a cold build and +1.9 MB of
//! binary for what these ~500 lines do (docs/benchmarks/gateway_build.md).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use crate::telemetry::otlp;

tokio::task_local! {
    /// The span a request's work runs under, for the spans and worker calls it makes.
    static CURRENT: Context;
}

/// One span's identity as W3C trace context carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    pub trace_id: u128,
    pub span_id: u64,
    pub sampled: bool,
}

impl Context {
    /// `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        let flags = if self.sampled { "01" } else { "00" };
        format!("00-{:032x}-{:016x}-{flags}", self.trace_id, self.span_id)
    }

    /// A W3C traceparent header, or None when it is not one (then a new trace starts, as the
    /// OpenTelemetry propagator does with an invalid header). Pure.
    pub fn parse(header: &str) -> Option<Context> {
        let parts: Vec<&str> = header.trim().split('-').collect();
        if parts.len() < 4 {
            return None;
        }
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let (version, trace, span, flags) = (parts[0], parts[1], parts[2], parts[3]);
        if !hex(version, 2) || version == "ff" || (version == "00" && parts.len() != 4) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let span_id = u64::from_str_radix(span, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(Context {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

/// The span the current task's work runs under, if it is traced.
pub fn current() -> Option<Context> {
    CURRENT.try_with(|c| *c).ok()
}

/// `fut` with `context` as its current span (unchanged when None).
pub async fn within<F: Future>(context: Option<Context>, fut: F) -> F::Output {
    match context {
        Some(c) => CURRENT.scope(c, fut).await,
        None => fut.await,
    }
}

/// Where and how this process traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub endpoint: String,
    pub service_name: String,
    pub sample_ratio: f64,
}

/// The tracing this process runs with (None: off), from its settings and the OTEL_ env:
/// OTEL_SDK_DISABLED=true turns it off; an empty endpoint falls
/// back to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT; an empty service
/// name to OTEL_SERVICE_NAME, then embedfleet-gateway. Pure given `env`.
pub fn config(
    endpoint: &str,
    service_name: &str,
    sample_ratio: f64,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Config>, String> {
    let var = |name: &str| env(name).map(|v| v.trim().to_string()).unwrap_or_default();
    if var("OTEL_SDK_DISABLED").to_lowercase() == "true" {
        return Ok(None);
    }
    let mut chosen = endpoint.trim().to_string();
    for fallback in [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        if chosen.is_empty() {
            chosen = var(fallback);
        }
    }
    if chosen.is_empty() {
        return Ok(None);
    }
    if !(sample_ratio.is_finite() && (0.0..=1.0).contains(&sample_ratio)) {
        return Err(format!(
            "tracing sample ratio must be between 0 and 1, got {sample_ratio}"
        ));
    }
    let mut name = service_name.trim().to_string();
    if name.is_empty() {
        name = var("OTEL_SERVICE_NAME");
    }
    if name.is_empty() {
        name = "embedfleet-gateway".into();
    }
    Ok(Some(Config {
        endpoint: chosen,
        service_name: name,
        sample_ratio,
    }))
}

/// TraceIdRatioBased's bound: a new trace is sampled when its id's low 64 bits are below it.
pub fn ratio_bound(ratio: f64) -> u128 {
    (ratio * (u64::MAX as f64 + 1.0)).round() as u128
}

/// A span's kind, as OTLP numbers them.
#[derive(Clone, Copy)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

enum Value {
    Int(i64),
    Text(String),
}

/// A finished (or running) span's record.
struct Record {
    context: Context,
    parent: u64,
    name: String,
    kind: Kind,
    start_ns: u64,
    end_ns: u64,
    attributes: Vec<(&'static str, Value)>,
    error: Option<String>,
}

/// The batch span processor's settings (OTEL_BSP_*, milliseconds and counts).
struct Batching {
    delay: Duration,
    max_queue: usize,
    max_batch: usize,
    timeout: Duration,
}

struct Inner {
    bound: u128,
    queue: Mutex<Vec<Record>>,
    /// a full batch is waiting, or the process is stopping
    wake: Notify,
    batching: Batching,
    resource: Vec<(String, String)>,
}

#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Inner>>);

/// A span being recorded; ended (and queued for export) when dropped. Unsampled or with
/// tracing off it records nothing but may still carry a context to propagate.
pub struct Span {
    tracer: Option<Arc<Inner>>,
    record: Option<Record>,
    context: Option<Context>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A whole number from the env (milliseconds or counts), else `default`.
fn env_number(env: &dyn Fn(&str) -> Option<String>, name: &str, default: u64) -> u64 {
    env(name)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// OTEL_RESOURCE_ATTRIBUTES: `key=value` pairs, comma-separated, percent-encoded values. Pure.
pub fn resource_attributes(raw: &str) -> Vec<(String, String)> {
    raw.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decoded(v.trim())))
        })
        .collect()
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Tracer {
    pub fn off() -> Self {
        Tracer(None)
    }

    /// A tracer exporting to `config.endpoint` from a background task (within the runtime).
    pub fn start(config: &Config, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let channel = otlp::channel(&config.endpoint)?;
        let mut resource = vec![("service.name".to_string(), config.service_name.clone())];
        for (k, v) in resource_attributes(&env("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default()) {
            if k != "service.name" {
                resource.push((k, v));
            }
        }
        let inner = Arc::new(Inner {
            bound: ratio_bound(config.sample_ratio),
            queue: Mutex::new(Vec::new()),
            wake: Notify::new(),
            batching: Batching {
                delay: Duration::from_millis(env_number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000)),
                max_queue: env_number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048) as usize,
                max_batch: env_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512).max(1) as usize,
                timeout: Duration::from_millis(env_number(env, "OTEL_BSP_EXPORT_TIMEOUT", 30000)),
            },
            resource,
        });
        tokio::spawn(export_loop(Arc::clone(&inner), channel));
        Ok(Tracer(Some(inner)))
    }

    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// A SERVER span continuing `traceparent` when it is one, else the root of a new trace
    /// (sampled by the ratio).
    pub fn server(&self, name: String, traceparent: Option<&str>) -> Span {
        let Some(inner) = &self.0 else {
            return Span::none();
        };
        let (trace_id, parent, sampled) = match traceparent.and_then(Context::parse) {
            Some(p) => (p.trace_id, p.span_id, p.sampled),
            None => {
                let trace_id = new_trace_id();
                let sampled = (trace_id & u64::MAX as u128) < inner.bound;
                (trace_id, 0, sampled)
            }
        };
        Span::begin(inner, trace_id, parent, sampled, name, Kind::Server)
    }

    /// A child of the current span (none without one: only requests make traces).
    pub fn child(&self, name: &str, kind: Kind) -> Span {
        match (&self.0, current()) {
            (Some(inner), Some(p)) => {
                Span::begin(inner, p.trace_id, p.span_id, p.sampled, name.into(), kind)
            }
            _ => Span::none(),
        }
    }

    /// Exports what is queued (the process is stopping); bounded by the export timeout.
    pub async fn shutdown(&self) {
        if let Some(inner) = &self.0 {
            inner.wake.notify_one();
            let deadline = tokio::time::Instant::now() + inner.batching.timeout;
            while !inner.queue.lock().expect("trace queue").is_empty()
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn new_trace_id() -> u128 {
    loop {
        let id = (u128::from(fastrand::u64(..)) << 64) | u128::from(fastrand::u64(..));
        if id != 0 {
            return id;
        }
    }
}

fn new_span_id() -> u64 {
    fastrand::u64(1..)
}

impl Default for Span {
    /// A span of nothing: tracing off or nothing to trace.
    fn default() -> Self {
        Span::none()
    }
}

/// `traceparent` metadata naming the current span, on an outgoing worker call.
pub fn inject<T>(call: &mut tonic::Request<T>) {
    if let Some(context) = current() {
        if let Ok(value) = context.traceparent().parse() {
            call.metadata_mut().insert("traceparent", value);
        }
    }
}

impl Span {
    fn none() -> Self {
        Span {
            tracer: None,
            record: None,
            context: None,
        }
    }

    fn begin(
        inner: &Arc<Inner>,
        trace_id: u128,
        parent: u64,
        sampled: bool,
        name: String,
        kind: Kind,
    ) -> Self {
        let context = Context {
            trace_id,
            span_id: new_span_id(),
            sampled,
        };
        let record = sampled.then(|| Record {
            context,
            parent,
            name,
            kind,
            start_ns: now_ns(),
            end_ns: 0,
            attributes: Vec::new(),
            error: None,
        });
        Span {
            tracer: Some(Arc::clone(inner)),
            record,
            context: Some(context),
        }
    }

    /// This span's context (for its children and the calls it makes), when tracing is on.
    pub fn context(&self) -> Option<Context> {
        self.context
    }

    pub fn int(&mut self, key: &'static str, value: i64) {
        if let Some(r) = &mut self.record {
            r.attributes.push((key, Value::Int(value)));
        }
    }

    pub fn text(&mut self, key: &'static str, value: &str) {
        if let Some(r) = &mut self.record {
            r.attributes.push((key, Value::Text(value.to_string())));
        }
    }

    /// Status ERROR with `message` (a gRPC code's name).
    pub fn error(&mut self, message: &str) {
        if let Some(r) = &mut self.record {
            r.error = Some(message.to_string());
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let (Some(inner), Some(mut record)) = (self.tracer.take(), self.record.take()) else {
            return;
        };
        record.end_ns = now_ns();
        let mut queue = inner.queue.lock().expect("trace queue");
        if queue.len() >= inner.batching.max_queue {
            drop(queue);
            // Never waited for: a request does not slow down because the collector does.
            if let Some(held) = DROP_LOG.allow(std::time::Instant::now()) {
                tracing::warn!(
                    max_queue = inner.batching.max_queue,
                    suppressed = held,
                    "trace spans dropped: the export queue is full"
                );
            }
            return;
        }
        queue.push(record);
        if queue.len() >= inner.batching.max_batch {
            inner.wake.notify_one();
        }
    }
}

/// One line per minute at most about spans dropped on a full queue.
static DROP_LOG: crate::telemetry::logs::Limiter =
    crate::telemetry::logs::Limiter::new(Duration::from_secs(60));

/// One line per minute at most about failing exports (the collector may be down for long).
static EXPORT_LOG: crate::telemetry::logs::Limiter =
    crate::telemetry::logs::Limiter::new(Duration::from_secs(60));

async fn export_loop(inner: Arc<Inner>, channel: tonic::transport::Channel) {
    let mut client = otlp::TraceServiceClient::new(channel);
    loop {
        tokio::select! {
            () = tokio::time::sleep(inner.batching.delay) => {}
            () = inner.wake.notified() => {}
        }
        loop {
            let batch: Vec<Record> = {
                let mut queue = inner.queue.lock().expect("trace queue");
                let n = queue.len().min(inner.batching.max_batch);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            let count = batch.len();
            let mut request = tonic::Request::new(message(&inner.resource, batch));
            request.set_timeout(inner.batching.timeout);
            if let Err(status) = client.export(request).await {
                if let Some(held) = EXPORT_LOG.allow(std::time::Instant::now()) {
                    tracing::warn!(
                        code = ?status.code(),
                        spans = count,
                        suppressed = held,
                        "trace export failed",
                    );
                }
            }
        }
    }
}

fn key_value(key: &str, value: otlp::any_value::Value) -> otlp::KeyValue {
    otlp::KeyValue {
        key: key.to_string(),
        value: Some(otlp::AnyValue { value: Some(value) }),
    }
}

/// The export message of `records`. Pure.
fn message(resource: &[(String, String)], records: Vec<Record>) -> otlp::ExportTraceServiceRequest {
    use otlp::any_value::Value as V;
    let spans = records
        .into_iter()
        .map(|r| otlp::Span {
            trace_id: r.context.trace_id.to_be_bytes().to_vec(),
            span_id: r.context.span_id.to_be_bytes().to_vec(),
            parent_span_id: if r.parent == 0 {
                Vec::new()
            } else {
                r.parent.to_be_bytes().to_vec()
            },
            flags: 0x100 | u32::from(r.context.sampled),
            name: r.name,
            kind: r.kind as i32,
            start_time_unix_nano: r.start_ns,
            end_time_unix_nano: r.end_ns,
            attributes: r
                .attributes
                .into_iter()
                .map(|(k, v)| {
                    key_value(
                        k,
                        match v {
                            Value::Int(i) => V::IntValue(i),
                            Value::Text(t) => V::StringValue(t),
                        },
                    )
                })
                .collect(),
            status: r.error.map(|message| otlp::Status {
                message,
                code: otlp::status::StatusCode::Error as i32,
            }),
        })
        .collect();
    let attributes = resource
        .iter()
        .map(|(k, v)| key_value(k, V::StringValue(v.clone())))
        .collect();
    otlp::ExportTraceServiceRequest {
        resource_spans: vec![otlp::ResourceSpans {
            resource: Some(otlp::Resource { attributes }),
            scope_spans: vec![otlp::ScopeSpans {
                scope: Some(otlp::InstrumentationScope {
                    name: SCOPE.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
}

/// The instrumentation scope the spans carry.
const SCOPE: &str = "embedfleet.gateway";

/// The env a process was started with, as a lookup (for `config` and `Tracer::start`).
pub fn process_env() -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = std::env::vars().collect();
    move |name| vars.get(name).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_round_trip_and_bad_ones_start_a_new_trace() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = Context::parse(header).unwrap();
        assert_eq!(c.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(c.span_id, 0x00f067aa0ba902b7);
        assert!(c.sampled);
        assert_eq!(c.traceparent(), header);
        let unsampled = Context::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert!(!unsampled.unwrap().sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(Context::parse(bad), None, "{bad}");
        }
        // a later version may append fields
        assert!(
            Context::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x").is_some()
        );
    }

    #[test]
    fn settings_win_over_the_otel_env_and_the_kill_switch_wins_over_all() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        let none = env(&[]);
        assert_eq!(config("", "", 1.0, &none), Ok(None));
        let on = config(" http://c:4317 ", "", 0.5, &none).unwrap().unwrap();
        assert_eq!(on.endpoint, "http://c:4317");
        assert_eq!(on.service_name, "embedfleet-gateway");
        let otel = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://b:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a:4317"),
            ("OTEL_SERVICE_NAME", "gw"),
        ]);
        let from_env = config("", "", 1.0, &otel).unwrap().unwrap();
        assert_eq!(
            (from_env.endpoint.as_str(), from_env.service_name.as_str()),
            ("http://a:4317", "gw")
        );
        assert_eq!(
            config("http://x:1", "mine", 1.0, &otel)
                .unwrap()
                .unwrap()
                .service_name,
            "mine"
        );
        let off = env(&[("OTEL_SDK_DISABLED", "TRUE")]);
        assert_eq!(config("http://x:1", "", 1.0, &off), Ok(None));
        let bad = config("http://x:1", "", 1.5, &none).unwrap_err();
        assert!(bad.contains("between 0 and 1, got 1.5"), "{bad}");
        assert!(config("http://x:1", "", f64::NAN, &none).is_err());
    }

    #[test]
    fn the_ratio_bound_is_trace_id_ratio_based() {
        assert_eq!(ratio_bound(0.0), 0);
        assert_eq!(ratio_bound(1.0), 1u128 << 64);
        assert_eq!(ratio_bound(0.5), 1u128 << 63);
    }

    #[test]
    fn resource_attributes_are_key_value_pairs_percent_decoded() {
        assert_eq!(
            resource_attributes("a=1, b = x%20y ,bad,=v,c=%zz"),
            vec![
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "x y".to_string()),
                ("c".to_string(), "%zz".to_string()),
            ]
        );
    }
}
