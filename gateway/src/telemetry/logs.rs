//! Logs through `tracing`: one JSON object a line on stderr (`ts` in epoch seconds, `level`,
//! `logger`, `msg`, then the event's fields), or tracing-subscriber's text lines at a terminal.
//! Fields carry counts, addresses and error kinds, never request text or secrets.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// This crate's events, by their target's first segment.
const CRATE: &str = "embedfleet_gateway";

/// `--log-level`'s names: warning is `tracing`'s WARN.
pub fn level(name: &str) -> LevelFilter {
    match name {
        "debug" => LevelFilter::DEBUG,
        "warning" => LevelFilter::WARN,
        "error" => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    }
}

/// Logs from here on: this crate's events from `least` up, other crates' warnings and errors.
pub fn init(least: LevelFilter, json: bool) {
    let filter = Targets::new()
        .with_target(CRATE, least)
        .with_default(least.min(LevelFilter::WARN));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry();
    // A second init (tests) keeps the first.
    let _ = if json {
        registry
            .with(layer.event_format(JsonLines).with_filter(filter))
            .try_init()
    } else {
        registry.with(layer.with_filter(filter)).try_init()
    };
}

/// `embedfleet_gateway::upstream::pool` as loggers are named:
/// `embedfleet.gateway.upstream.pool`.
fn logger(target: &str) -> String {
    target
        .replacen(CRATE, "embedfleet.gateway", 1)
        .replace("::", ".")
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        _ => "debug",
    }
}

/// An event's message and fields as JSON values, in the event's order.
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.msg = value.to_string(),
            name => self.rest.push((name, Value::from(value))),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.push((field.name(), Value::from(value)));
    }

    /// `?list` fields (addresses) are written as the JSON arrays their Debug text is; any
    /// other Debug or Display value as a string.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.msg = text;
            return;
        }
        let parsed = text
            .starts_with('[')
            .then(|| serde_json::from_str::<Value>(&text).ok())
            .flatten();
        self.rest
            .push((field.name(), parsed.unwrap_or(Value::String(text))));
    }
}

/// One record as its JSON line: the four standard keys first, then the fields in the event's
/// order, none of which replaces a standard key. Pure.
fn json_line(ts: f64, level: &Level, target: &str, fields: &Fields) -> String {
    let mut out = format!(
        "{{\"ts\":{},\"level\":\"{}\",\"logger\":{},\"msg\":{}",
        Value::from((ts * 1e6).round() / 1e6),
        level_name(level),
        Value::from(logger(target)),
        Value::from(fields.msg.as_str()),
    );
    for (key, value) in &fields.rest {
        if !["ts", "level", "logger", "msg"].contains(key) {
            out.push_str(&format!(",{}:{value}", Value::from(*key)));
        }
    }
    out.push('}');
    out
}

struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let meta = event.metadata();
        writeln!(
            writer,
            "{}",
            json_line(ts, meta.level(), meta.target(), &fields)
        )
    }
}

/// One line per `every` and a count of those held back in between, for a line a client or an
/// outage can cause at any rate.
pub struct Limiter {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Limiter {
    pub const fn new(every: Duration) -> Self {
        Limiter {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// The count held back since the last line let through, or None to stay quiet.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().expect("limiter lock");
        let (next, held) = &mut *state;
        if next.is_some_and(|at| now < at) {
            *held += 1;
            return None;
        }
        *next = Some(now + self.every);
        Some(std::mem::take(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_the_standard_keys_then_the_fields() {
        let fields = Fields {
            msg: "worker ejected".into(),
            rest: vec![
                ("worker", Value::from("10.0.0.1:50051")),
                ("msg", Value::from("x")),
            ],
        };
        let got = json_line(
            1.23456789,
            &Level::WARN,
            "embedfleet_gateway::upstream::pool",
            &fields,
        );
        let parsed: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(parsed["ts"], 1.234568);
        assert_eq!(parsed["level"], "warning");
        assert_eq!(parsed["logger"], "embedfleet.gateway.upstream.pool");
        assert_eq!(parsed["msg"], "worker ejected"); // a field never replaces it
        assert_eq!(parsed["worker"], "10.0.0.1:50051");
        assert!(got.starts_with("{\"ts\":"));
    }

    #[test]
    fn levels_read_the_settings_names() {
        assert_eq!(level("warning"), LevelFilter::WARN);
        assert_eq!(level("debug"), LevelFilter::DEBUG);
        assert_eq!(level("error"), LevelFilter::ERROR);
        assert_eq!(level("info"), LevelFilter::INFO);
    }

    #[test]
    fn the_limiter_lets_one_through_per_interval_and_counts_the_rest() {
        let limiter = Limiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limiter.allow(t0), Some(0));
        assert_eq!(limiter.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(limiter.allow(t0 + Duration::from_secs(9)), None);
        assert_eq!(limiter.allow(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(limiter.allow(t0 + Duration::from_secs(11)), None);
    }
}
