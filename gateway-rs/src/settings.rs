//! The settings this binary supports, by the Python gateway's names: each is the flag
//! `--max-input-tokens` and the env var `EMBEDFLEET_GATEWAY_MAX_INPUT_TOKENS` (flag > env >
//! default). Every Python gateway setting is one of them; any other name is refused.

pub const ENV_PREFIX: &str = "EMBEDFLEET_GATEWAY_";

#[derive(Debug, Clone)]
pub struct Settings {
    pub model: String,
    pub task: String,
    pub served_model_name: String,
    /// a shared gateway's models, each with its own per-model settings (catalog.rs)
    pub models_file: String,
    pub max_input_tokens: usize,
    pub quantization_file: String,
    pub split_long_inputs: bool,
    pub split_overlap_tokens: usize,
    pub api_keys_file: String,
    pub api_keys_reload_seconds: f64,
    pub api_key_metrics: bool,
    pub workers: Vec<String>,
    pub workers_file: String,
    pub k8s_service: String,
    pub k8s_port_name: String,
    pub kubeconfig: String,
    pub max_client_batch: usize,
    pub max_request_tokens: usize,
    pub max_body_bytes: usize,
    pub chunk_tokens: usize,
    pub min_chunk_tokens: usize,
    pub chunk_sequences: usize,
    pub chunk_seconds: f64,
    /// None: by the device each worker reports (coalescing::inflight_for)
    pub coalesce_inflight: Option<usize>,
    /// small calls as messages of one EmbedStream per worker (Rust only; stream.rs)
    pub coalesce_stream: bool,
    pub max_queue_seconds: f64,
    pub hold_requests: usize,
    pub hold_seconds: f64,
    pub tokenize_threads: usize,
    pub tokenize_inline_chars: usize,
    pub tokenize_large_chars: usize,
    pub retry_after_seconds: u64,
    pub eject_seconds: f64,
    pub upstream_timeout_seconds: f64,
    pub probe_seconds: f64,
    pub header_timeout_seconds: f64,
    pub body_timeout_seconds: f64,
    pub keep_alive_seconds: f64,
    pub max_connection_age_seconds: f64,
    pub max_connections: u64,
    pub host: String,
    pub port: u16,
    pub log_level: String,
    /// OTLP/gRPC collector (trace.rs; empty: the OTEL_ env, else off), service.name, sampling
    pub tracing_endpoint: String,
    pub tracing_service_name: String,
    pub tracing_sample_ratio: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            model: String::new(),
            task: "auto".into(),
            served_model_name: String::new(),
            models_file: String::new(),
            max_input_tokens: 0,
            quantization_file: String::new(),
            split_long_inputs: false,
            split_overlap_tokens: 32,
            api_keys_file: String::new(),
            api_keys_reload_seconds: 1.0,
            api_key_metrics: false,
            workers: Vec::new(),
            workers_file: String::new(),
            k8s_service: String::new(),
            k8s_port_name: "grpc".into(),
            kubeconfig: String::new(),
            max_client_batch: 2048,
            max_request_tokens: 1_000_000,
            max_body_bytes: 16 * 1024 * 1024,
            chunk_tokens: 8192,
            min_chunk_tokens: 512,
            chunk_sequences: 256,
            chunk_seconds: 1.0,
            coalesce_inflight: None,
            coalesce_stream: true,
            max_queue_seconds: 30.0,
            hold_requests: 0,
            hold_seconds: 120.0,
            tokenize_threads: 2,
            // Python's is 256: its thread hop is cheap beside its per-call costs; here, at 1x20
            // x16, inline below 16 KiB measured less CPU than any hop (docs/gateway.md).
            tokenize_inline_chars: 16 * 1024,
            tokenize_large_chars: 65536,
            retry_after_seconds: 1,
            eject_seconds: 5.0,
            upstream_timeout_seconds: 60.0,
            probe_seconds: 2.0,
            header_timeout_seconds: 10.0,
            body_timeout_seconds: 60.0,
            keep_alive_seconds: 5.0,
            max_connection_age_seconds: 300.0,
            max_connections: 0,
            host: "127.0.0.1".into(),
            port: 8080,
            log_level: "info".into(),
            tracing_endpoint: String::new(),
            tracing_service_name: String::new(),
            tracing_sample_ratio: 1.0,
        }
    }
}

fn number<T: std::str::FromStr>(name: &str, raw: &str) -> Result<T, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("--{}: invalid value {raw:?}", name.replace('_', "-")))
}

/// A bound in seconds: finite, never "forever" by accident (its least value is MINIMUMS').
fn seconds(name: &str, raw: &str) -> Result<f64, String> {
    let value: f64 = number(name, raw)?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!(
            "--{}: invalid value {raw:?}, expected a finite number of seconds",
            name.replace('_', "-")
        ))
    }
}

/// The Python settings' booleans (common/settings.py): 1/true/yes/on, 0/false/no/off.
fn boolean(name: &str, raw: &str) -> Result<bool, String> {
    match raw.trim().to_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "--{}: invalid value {raw:?}, expected one of 0, 1, false, no, off, on, true, yes",
            name.replace('_', "-")
        )),
    }
}

/// The least value of each numeric setting, the Python gateway's `minimum=` (gateway/settings.py)
/// one for one: below it (or NaN) a start is refused with the Python message, never a process
/// that panics on a zero interval or runs every call past a negative deadline.
const MINIMUMS: &[(&str, f64)] = &[
    ("split_overlap_tokens", 0.0),
    ("api_keys_reload_seconds", 0.01),
    ("max_client_batch", 1.0),
    ("max_request_tokens", 1.0),
    ("max_body_bytes", 1.0),
    ("chunk_tokens", 1.0),
    ("min_chunk_tokens", 1.0),
    ("chunk_sequences", 1.0),
    ("chunk_seconds", 0.0),
    ("coalesce_inflight", 0.0),
    ("max_queue_seconds", 0.0),
    ("retry_after_seconds", 0.0),
    ("hold_requests", 0.0),
    ("hold_seconds", 0.0),
    ("eject_seconds", 0.0),
    ("upstream_timeout_seconds", 0.01),
    ("probe_seconds", 0.01),
    ("tokenize_threads", 1.0),
    ("tokenize_inline_chars", 0.0),
    ("tokenize_large_chars", 0.0),
    ("header_timeout_seconds", 0.0),
    ("body_timeout_seconds", 0.0),
    ("keep_alive_seconds", 0.0),
    ("max_connection_age_seconds", 0.0),
    ("max_connections", 0.0),
];

/// The minimum of `name`, when it has one.
pub fn minimum(name: &str) -> Option<f64> {
    MINIMUMS.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

pub fn apply(s: &mut Settings, name: &str, raw: &str) -> Result<(), String> {
    if let (Some(least), Ok(value)) = (minimum(name), raw.trim().parse::<f64>()) {
        // Written so NaN fails too: it compares false with anything.
        if !(value >= least) {
            return Err(format!(
                "--{}: {} is below the minimum, {least}",
                name.replace('_', "-"),
                raw.trim()
            ));
        }
    }
    match name {
        "model" => s.model = raw.into(),
        "task" => s.task = raw.into(),
        "served_model_name" => s.served_model_name = raw.into(),
        "models_file" => s.models_file = raw.into(),
        "max_input_tokens" => s.max_input_tokens = number(name, raw)?,
        "quantization_file" => s.quantization_file = raw.into(),
        "split_long_inputs" => s.split_long_inputs = boolean(name, raw)?,
        "split_overlap_tokens" => s.split_overlap_tokens = number(name, raw)?,
        "api_keys_file" => s.api_keys_file = raw.into(),
        "api_keys_reload_seconds" => s.api_keys_reload_seconds = number(name, raw)?,
        "api_key_metrics" => s.api_key_metrics = boolean(name, raw)?,
        "workers" => {
            s.workers = raw
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        }
        "workers_file" => s.workers_file = raw.into(),
        "k8s_service" => s.k8s_service = raw.into(),
        "k8s_port_name" => s.k8s_port_name = raw.into(),
        "kubeconfig" => s.kubeconfig = raw.into(),
        "max_client_batch" => s.max_client_batch = number(name, raw)?,
        "max_request_tokens" => s.max_request_tokens = number(name, raw)?,
        "max_body_bytes" => s.max_body_bytes = number(name, raw)?,
        "chunk_tokens" => s.chunk_tokens = number(name, raw)?,
        "min_chunk_tokens" => s.min_chunk_tokens = number(name, raw)?,
        "chunk_sequences" => s.chunk_sequences = number(name, raw)?,
        "chunk_seconds" => s.chunk_seconds = number(name, raw)?,
        "coalesce_inflight" => {
            s.coalesce_inflight = match raw.trim() {
                "" => None,
                _ => Some(number(name, raw)?),
            }
        }
        "coalesce_stream" => s.coalesce_stream = boolean(name, raw)?,
        "max_queue_seconds" => s.max_queue_seconds = seconds(name, raw)?,
        "hold_requests" => s.hold_requests = number(name, raw)?,
        "hold_seconds" => s.hold_seconds = seconds(name, raw)?,
        "tokenize_threads" => s.tokenize_threads = number(name, raw)?,
        "tokenize_inline_chars" => s.tokenize_inline_chars = number(name, raw)?,
        "tokenize_large_chars" => s.tokenize_large_chars = number(name, raw)?,
        "retry_after_seconds" => s.retry_after_seconds = number(name, raw)?,
        "eject_seconds" => s.eject_seconds = number(name, raw)?,
        "upstream_timeout_seconds" => s.upstream_timeout_seconds = number(name, raw)?,
        "probe_seconds" => s.probe_seconds = number(name, raw)?,
        "header_timeout_seconds" => s.header_timeout_seconds = seconds(name, raw)?,
        "body_timeout_seconds" => s.body_timeout_seconds = seconds(name, raw)?,
        "keep_alive_seconds" => s.keep_alive_seconds = seconds(name, raw)?,
        "max_connection_age_seconds" => s.max_connection_age_seconds = seconds(name, raw)?,
        "max_connections" => s.max_connections = number(name, raw)?,
        "tracing_endpoint" => s.tracing_endpoint = raw.into(),
        "tracing_service_name" => s.tracing_service_name = raw.into(),
        "tracing_sample_ratio" => s.tracing_sample_ratio = number(name, raw)?,
        "host" => s.host = raw.into(),
        "port" => s.port = number(name, raw)?,
        "log_level" => {
            if !["debug", "info", "warning", "error"].contains(&raw) {
                return Err(format!("--log-level: invalid choice {raw:?}"));
            }
            s.log_level = raw.into()
        }
        _ => return Err(format!("unknown setting --{}", name.replace('_', "-"))),
    }
    Ok(())
}

/// Settings from `env` (EMBEDFLEET_GATEWAY_*) and then `args` (`--flag value` or
/// `--flag=value`), so a flag wins over its env var.
pub fn load(
    args: &[String],
    env: impl Iterator<Item = (String, String)>,
) -> Result<Settings, String> {
    let mut s = Settings::default();
    let mut vars: Vec<(String, String)> = env
        .filter_map(|(k, v)| k.strip_prefix(ENV_PREFIX).map(|n| (n.to_lowercase(), v)))
        .collect();
    vars.sort();
    for (name, value) in vars {
        // An env var no setting has is not this program's (as in the Python gateway).
        match apply(&mut s, &name, &value) {
            Err(e) if e.starts_with("unknown setting") => {}
            other => other?,
        }
    }
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "-h" || arg == "--help" {
            return Err(help());
        }
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                i += 1;
                let v = args
                    .get(i)
                    .ok_or_else(|| format!("--{flag} needs a value"))?;
                (flag.to_string(), v.clone())
            }
        };
        apply(&mut s, &name.replace('-', "_"), &value)?;
        i += 1;
    }
    let named = !(s.workers.is_empty() && s.workers_file.is_empty() && s.k8s_service.is_empty());
    // A models file names each model's workers in its entry (catalog.rs).
    if !named && s.models_file.is_empty() {
        return Err(
            "name the workers: --workers host:port,..., --workers-file PATH or --k8s-service \
             [NAMESPACE/]NAME (or --models-file PATH)"
                .into(),
        );
    }
    Ok(s)
}

pub fn help() -> String {
    "embedfleet-gateway-rs: embedfleet-gateway in Rust, every task, one model or several.\n\
     Settings (flag or EMBEDFLEET_GATEWAY_<NAME>): --workers host:port,... and/or\n\
     --workers-file PATH, or --k8s-service [NAMESPACE/]NAME with --k8s-port-name and\n\
     --kubeconfig (one of the three required), or --models-file PATH (a JSON list of\n\
     models, each with its own per-model settings and workers), --model,\n\
     --task auto|embed|score|classify|sparse, --served-model-name, --max-input-tokens, --quantization-file,\n\
     --split-long-inputs, --split-overlap-tokens, --api-keys-file,\n\
     --api-keys-reload-seconds, --api-key-metrics, --max-client-batch,\n\
     --max-request-tokens, --max-body-bytes, --chunk-tokens, --min-chunk-tokens,\n\
     --chunk-sequences, --chunk-seconds, --coalesce-inflight, --coalesce-stream,\n\
     --max-queue-seconds,\n\
     --hold-requests, --hold-seconds, --tokenize-threads, --tokenize-inline-chars,\n\
     --tokenize-large-chars, --retry-after-seconds,\n\
     --eject-seconds, --upstream-timeout-seconds, --probe-seconds,\n\
     --header-timeout-seconds, --body-timeout-seconds, --keep-alive-seconds,\n\
     --max-connection-age-seconds, --max-connections, --host, --port, --log-level, --tracing-endpoint,\n\
     --tracing-service-name, --tracing-sample-ratio.\n\
     See docs/gateway.md, \"Rust gateway\"."
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_win_over_env() {
        let env = vec![
            ("EMBEDFLEET_GATEWAY_PORT".to_string(), "9000".to_string()),
            ("EMBEDFLEET_GATEWAY_WORKERS".to_string(), "a:1".to_string()),
        ];
        let s = load(
            &args(&["--port=9001", "--max-input-tokens", "512"]),
            env.into_iter(),
        )
        .unwrap();
        assert_eq!((s.port, s.max_input_tokens), (9001, 512));
        assert_eq!(s.workers, vec!["a:1"]);
    }

    #[test]
    fn booleans_read_as_the_python_settings_do() {
        let on = load(
            &args(&["--workers", "a:1", "--api-key-metrics", "Yes"]),
            std::iter::empty(),
        );
        assert!(on.unwrap().api_key_metrics);
        let off = load(
            &args(&["--workers", "a:1", "--api-key-metrics=0"]),
            std::iter::empty(),
        );
        assert!(!off.unwrap().api_key_metrics);
        let bad = load(
            &args(&["--workers", "a:1", "--api-key-metrics", "2"]),
            std::iter::empty(),
        );
        assert!(bad.unwrap_err().contains("--api-key-metrics"));
    }

    #[test]
    fn below_a_minimum_or_nan_is_refused_and_the_minimum_taken() {
        let refused = |flag: &str, value: &str| {
            load(
                &args(&["--workers", "a:1", flag, value]),
                std::iter::empty(),
            )
            .unwrap_err()
        };
        assert_eq!(
            refused("--probe-seconds", "0"),
            "--probe-seconds: 0 is below the minimum, 0.01"
        );
        assert!(refused("--upstream-timeout-seconds", "NaN").contains("below the minimum"));
        assert!(refused("--chunk-tokens", "0").contains("below the minimum, 1"));
        let s = load(
            &args(&[
                "--workers",
                "a:1",
                "--probe-seconds",
                "0.01",
                "--chunk-tokens",
                "1",
            ]),
            std::iter::empty(),
        )
        .unwrap();
        assert_eq!((s.probe_seconds, s.chunk_tokens), (0.01, 1));
    }

    #[test]
    fn bounds_are_seconds_not_below_zero() {
        let s = load(
            &args(&["--workers", "a:1", "--header-timeout-seconds", "2.5"]),
            std::iter::empty(),
        );
        assert_eq!(s.unwrap().header_timeout_seconds, 2.5);
        for bad in ["-1", "nan", "inf", "x"] {
            let e = load(
                &args(&["--workers", "a:1", "--keep-alive-seconds", bad]),
                std::iter::empty(),
            );
            assert!(e.unwrap_err().contains("--keep-alive-seconds"), "{bad}");
        }
    }

    #[test]
    fn workers_are_named_by_a_flag_or_a_models_file() {
        let shared = load(&args(&["--models-file", "m.json"]), std::iter::empty());
        assert_eq!(shared.unwrap().models_file, "m.json");
        let file = load(&args(&["--workers-file", "w"]), std::iter::empty());
        assert_eq!(file.unwrap().workers_file, "w");
        let e = load(&args(&["--no-such-flag", "1"]), std::iter::empty());
        assert!(e.unwrap_err().contains("unknown setting --no-such-flag"));
        let traced = vec![(
            "EMBEDFLEET_GATEWAY_TRACING_SAMPLE_RATIO".to_string(),
            "0.5".to_string(),
        )];
        let s = load(&args(&["--workers", "a:1"]), traced.into_iter()).unwrap();
        assert_eq!(s.tracing_sample_ratio, 0.5);
        assert!(load(&args(&[]), std::iter::empty()).is_err());
    }
}
