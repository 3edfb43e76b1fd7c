//! Log lines of embedfleet's Rust processes in the shape of every component's
//! (common/src/embedfleet/common/logs.py), so that one pod's or one terminal's lines read alike
//! whichever language wrote them: JSON, one object a line (`ts` in epoch seconds, `level`,
//! `logger`, `msg`, then the event's fields), or text for people (`HH:MM:SS level logger: msg
//! key=value ...`). Fields carry counts, addresses and error kinds, never request text or secrets.

mod fields;
mod limiter;

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

pub use limiter::Limiter;
pub use tracing_subscriber::filter::LevelFilter;

use fields::Fields;

/// How a process's events are named: its crate's target (`embedfleet_gateway`) and the logger
/// name that stands for it (`embedfleet.gateway`), modules following with dots.
#[derive(Debug, Clone, Copy)]
pub struct Naming {
    pub target: &'static str,
    pub logger: &'static str,
}

impl Naming {
    /// `embedfleet_gateway::upstream::pool` as loggers are named:
    /// `embedfleet.gateway.upstream.pool`.
    pub fn logger(&self, target: &str) -> String {
        target
            .replacen(self.target, self.logger, 1)
            .replace("::", ".")
    }
}

/// `--log-level`'s names: warning is `tracing`'s WARN.
pub fn level(name: &str) -> LevelFilter {
    match name {
        "debug" => LevelFilter::DEBUG,
        "warning" => LevelFilter::WARN,
        "error" => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    }
}

/// Logs on stderr from here on: `naming`'s crate's events from `least` up, other crates'
/// warnings and errors; JSON lines, or text ones. A second init (tests) keeps the first.
pub fn init(least: LevelFilter, json: bool, naming: Naming) {
    let filter = Targets::new()
        .with_target(naming.target, least)
        .with_default(least.min(LevelFilter::WARN));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .event_format(Lines { json, naming })
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        _ => "debug",
    }
}

/// One record as its JSON line: the four standard keys first, then the fields in the event's
/// order, none of which replaces a standard key. Pure.
fn json_line(ts: f64, level: &Level, logger: &str, fields: &Fields) -> String {
    let mut line = serde_json::Map::new();
    line.insert("ts".into(), ((ts * 1e6).round() / 1e6).into());
    line.insert("level".into(), level_name(level).into());
    line.insert("logger".into(), logger.into());
    line.insert("msg".into(), fields.msg.as_str().into());
    for (key, value) in &fields.rest {
        if !line.contains_key(*key) {
            line.insert((*key).into(), value.clone());
        }
    }
    serde_json::Value::Object(line).to_string()
}

/// One record as its text line, as logs.py's TextFormatter writes it: the wall clock's
/// HH:MM:SS, the level padded to 7, the logger, the message, two spaces and the fields. Pure.
fn text_line(clock: (u32, u32, u32), level: &Level, logger: &str, fields: &Fields) -> String {
    let (h, m, s) = clock;
    let mut line = format!(
        "{h:02}:{m:02}:{s:02} {:<7} {logger}: {}",
        level_name(level),
        fields.msg
    );
    for (at, (key, value)) in fields.rest.iter().enumerate() {
        line.push_str(if at == 0 { "  " } else { " " });
        match value {
            serde_json::Value::String(text) => line.push_str(&format!("{key}={text}")),
            other => line.push_str(&format!("{key}={other}")),
        }
    }
    line
}

/// The local wall clock's hour, minute and second at `now` (UTC where the zone is unknown).
fn local_clock(now: SystemTime) -> (u32, u32, u32) {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let Ok(time) = libc::time_t::try_from(secs) else {
        return (0, 0, 0);
    };
    // SAFETY: localtime_r writes only into `tm`, which outlives the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let filled = unsafe { !libc::localtime_r(&time, &mut tm).is_null() };
    if filled {
        let part = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        return (part(tm.tm_hour), part(tm.tm_min), part(tm.tm_sec));
    }
    let day = secs % 86_400;
    let part = |v: u64| u32::try_from(v).unwrap_or(0);
    (part(day / 3600), part(day % 3600 / 60), part(day % 60))
}

struct Lines {
    json: bool,
    naming: Naming,
}

impl<S, N> FormatEvent<S, N> for Lines
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
        let meta = event.metadata();
        let logger = self.naming.logger(meta.target());
        let now = SystemTime::now();
        let line = if self.json {
            let ts = now
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            json_line(ts, meta.level(), &logger, &fields)
        } else {
            text_line(local_clock(now), meta.level(), &logger, &fields)
        };
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    const GATEWAY: Naming = Naming {
        target: "embedfleet_gateway",
        logger: "embedfleet.gateway",
    };

    fn fields() -> Fields {
        Fields {
            msg: "worker ejected".into(),
            rest: vec![
                ("worker", Value::from("10.0.0.1:50051")),
                ("msg", Value::from("x")),
                ("failures", Value::from(3)),
            ],
        }
    }

    #[test]
    fn a_json_line_has_the_standard_keys_then_the_fields() {
        let logger = GATEWAY.logger("embedfleet_gateway::upstream::pool");
        let got = json_line(1.23456789, &Level::WARN, &logger, &fields());
        let parsed: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(parsed["ts"], 1.234568);
        assert_eq!(parsed["level"], "warning");
        assert_eq!(parsed["logger"], "embedfleet.gateway.upstream.pool");
        assert_eq!(parsed["msg"], "worker ejected"); // a field never replaces it
        assert_eq!(parsed["worker"], "10.0.0.1:50051");
        assert!(got.starts_with("{\"ts\":"));
    }

    #[test]
    fn a_text_line_reads_as_the_python_components() {
        let got = text_line(
            (9, 5, 7),
            &Level::INFO,
            "embedfleet.worker.front",
            &fields(),
        );
        assert_eq!(
            got,
            "09:05:07 info    embedfleet.worker.front: worker ejected  \
             worker=10.0.0.1:50051 msg=x failures=3"
        );
        let bare = Fields {
            msg: "listening".into(),
            rest: vec![],
        };
        assert_eq!(
            text_line((23, 59, 0), &Level::WARN, "x", &bare),
            "23:59:00 warning x: listening"
        );
    }

    #[test]
    fn other_crates_keep_their_own_names() {
        assert_eq!(GATEWAY.logger("h2::proto"), "h2.proto");
    }

    #[test]
    fn levels_read_the_settings_names() {
        assert_eq!(level("warning"), LevelFilter::WARN);
        assert_eq!(level("debug"), LevelFilter::DEBUG);
        assert_eq!(level("error"), LevelFilter::ERROR);
        assert_eq!(level("info"), LevelFilter::INFO);
    }
}
