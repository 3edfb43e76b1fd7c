//! The gateway's log lines: embedfleet_logs (crates/logs), the shape every embedfleet component
//! writes, under the gateway's logger names (`embedfleet.gateway.upstream.pool`).
use embedfleet_logs::{LevelFilter, Naming};

pub use embedfleet_logs::{level, Limiter};

const NAMING: Naming = Naming {
    target: "embedfleet_gateway",
    logger: "embedfleet.gateway",
};

/// Logs from here on: the gateway's events from `least` up, other crates' warnings and errors,
/// as JSON lines or text ones.
pub fn init(least: LevelFilter, json: bool) {
    embedfleet_logs::init(least, json, NAMING);
}
