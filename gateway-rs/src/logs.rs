//! JSON-lines logs in the Python components' shape (common/logs.py): one object per line on
//! stderr with `ts` (epoch seconds), `level`, `logger`, `msg` and the call's fields. Fields carry
//! counts, addresses and error kinds, never request text or secrets. `--log-level` filters them.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warning = 2,
    Error = 3,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }

    /// The settings' names (settings.rs checks them); anything else is info.
    pub fn parse(name: &str) -> Level {
        match name {
            "debug" => Level::Debug,
            "warning" => Level::Warning,
            "error" => Level::Error,
            _ => Level::Info,
        }
    }
}

static THRESHOLD: AtomicU8 = AtomicU8::new(Level::Info as u8);

pub fn set_level(level: Level) {
    THRESHOLD.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 >= THRESHOLD.load(Ordering::Relaxed)
}

/// `embedfleet_gateway_rs::pool` as the Python loggers are named: `embedfleet.gateway_rs.pool`.
fn logger(module: &str) -> String {
    module
        .replacen("embedfleet_gateway_rs", "embedfleet.gateway_rs", 1)
        .replace("::", ".")
}

/// One record as its JSON line (without the newline): the four standard keys first, then the
/// fields in the call's order, none of which replaces a standard key.
pub fn line(ts: f64, level: Level, module: &str, msg: &str, fields: &[(&str, Value)]) -> String {
    let mut out = format!(
        "{{\"ts\":{},\"level\":\"{}\",\"logger\":{},\"msg\":{}",
        Value::from((ts * 1e6).round() / 1e6),
        level.name(),
        Value::from(logger(module)),
        Value::from(msg),
    );
    for (key, value) in fields {
        if !["ts", "level", "logger", "msg"].contains(key) {
            out.push_str(&format!(",{}:{value}", Value::from(*key)));
        }
    }
    out.push('}');
    out
}

pub fn emit(level: Level, module: &str, msg: &str, fields: &[(&str, Value)]) {
    if !enabled(level) {
        return;
    }
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut text = line(ts, level, module, msg, fields);
    text.push('\n');
    // One write per record, so concurrent records never interleave within a line.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `log!(Warning, "worker ejected", "worker" => address, "code" => name)`.
#[macro_export]
macro_rules! log {
    ($level:ident, $msg:expr $(, $key:literal => $value:expr)* $(,)?) => {
        if $crate::logs::enabled($crate::logs::Level::$level) {
            $crate::logs::emit(
                $crate::logs::Level::$level,
                module_path!(),
                &$msg,
                &[$(($key, ::serde_json::json!($value))),*],
            )
        }
    };
}

/// One line per `every` and a count of those held back in between (common/logs.py's
/// LogLimiter), for a line a client or an outage can cause at any rate.
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
    fn a_line_has_the_python_keys_then_the_fields() {
        let got = line(
            1.23456789,
            Level::Warning,
            "embedfleet_gateway_rs::pool",
            "worker ejected",
            &[
                ("worker", Value::from("10.0.0.1:50051")),
                ("msg", Value::from("x")),
            ],
        );
        let parsed: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(parsed["ts"], 1.234568);
        assert_eq!(parsed["level"], "warning");
        assert_eq!(parsed["logger"], "embedfleet.gateway_rs.pool");
        assert_eq!(parsed["msg"], "worker ejected"); // a field never replaces it
        assert_eq!(parsed["worker"], "10.0.0.1:50051");
        assert!(got.starts_with("{\"ts\":"));
    }

    #[test]
    fn levels_filter_from_the_threshold_up() {
        assert!(Level::parse("debug") < Level::parse("info"));
        assert_eq!(Level::parse("warning"), Level::Warning);
        assert_eq!(Level::parse("error"), Level::Error);
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
