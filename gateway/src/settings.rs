//! Every setting, declared once: the field's doc comment is its `--help` text and its row of
//! contract/settings.md; each is the flag `--max-input-tokens` and the env var
//! `EMBEDFLEET_GATEWAY_MAX_INPUT_TOKENS` (a flag wins over its env var), and a number below its
//! minimum is refused at start with one line.

use std::fmt::Write;

use clap::builder::BoolishValueParser;
use clap::error::{ContextKind, ErrorKind};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

pub const ENV_PREFIX: &str = "EMBEDFLEET_GATEWAY_";

/// The settings an entry of a models file may set: what differs from model to model.
pub const PER_MODEL: [&str; 17] = [
    "model",
    "task",
    "served_model_name",
    "max_input_tokens",
    "quantization_file",
    "split_long_inputs",
    "split_overlap_tokens",
    "workers",
    "workers_file",
    "k8s_service",
    "k8s_port_name",
    "chunk_tokens",
    "min_chunk_tokens",
    "chunk_sequences",
    "max_queue_seconds",
    "hold_requests",
    "hold_seconds",
];

/// A value of at least `least` (NaN never is), then read as a `T`.
fn at_least<T: std::str::FromStr>(
    least: f64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |raw| {
        let text = raw.trim();
        if let Ok(value) = text.parse::<f64>() {
            if value.is_nan() || value < least {
                return Err(format!("{text} is below the minimum, {least}"));
            }
        }
        text.parse().map_err(|_| format!("invalid value {raw:?}"))
    }
}

/// A bound in seconds of at least `least`: finite, never "forever" by accident.
fn seconds(least: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |raw| {
        let value = at_least::<f64>(least)(raw)?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(format!(
                "invalid value {raw:?}, expected a finite number of seconds"
            ))
        }
    }
}

/// `parse`'s value, or None for an empty one.
fn unset_or<T>(
    parse: impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static,
) -> impl Fn(&str) -> Result<Option<T>, String> + Clone + Send + Sync + 'static {
    move |raw| match raw.trim() {
        "" => Ok(None),
        _ => parse(raw).map(Some),
    }
}

/// Worker addresses, comma-separated (blank items dropped).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Addresses(pub Vec<String>);

fn addresses(raw: &str) -> Result<Addresses, String> {
    Ok(Addresses(
        raw.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
    ))
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// JSON lines, unless stderr is a terminal
    Auto,
    Json,
    Text,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "embedfleet-gateway",
    about = "embedfleet's gateway: OpenAI-compatible embeddings, rerank, score, classify and \
             sparse embeddings in front of embedfleet workers.",
    long_about = None,
    allow_negative_numbers = true,
    args_override_self = true,
    after_help = "Every setting is also an env var: EMBEDFLEET_GATEWAY_<NAME>. \
                  Reference: gateway/contract/settings.md."
)]
pub struct Settings {
    /// Model directory or file:// URL (empty: the bundled all-MiniLM-L6-v2)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MODEL", default_value = "")]
    pub model: String,
    /// What the model is served as: auto (from its checkpoint), embed, score, classify, sparse,
    /// multivector, hybrid
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TASK", default_value = "auto")]
    pub task: String,
    /// The name requests use in `model` (empty: the model's own)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_SERVED_MODEL_NAME", default_value = "")]
    pub served_model_name: String,
    /// A JSON file {"models": [...]} of several models, each with its own per-model settings
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MODELS_FILE", default_value = "")]
    pub models_file: String,
    /// Token limit of one input (0: the model's own)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_INPUT_TOKENS", default_value_t = 0)]
    pub max_input_tokens: usize,
    /// int8/uint8 calibration file (empty: the model directory's, or the bundled model's)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_QUANTIZATION_FILE", default_value = "")]
    pub quantization_file: String,
    /// Embed inputs over the limit as windows averaged back, unless a request says otherwise
    #[arg(long, env = "EMBEDFLEET_GATEWAY_SPLIT_LONG_INPUTS", default_value_t = false,
          action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub split_long_inputs: bool,
    /// Tokens shared by consecutive windows of a split input
    #[arg(long, env = "EMBEDFLEET_GATEWAY_SPLIT_OVERLAP_TOKENS", default_value_t = 32,
          value_parser = at_least::<usize>(0.0))]
    pub split_overlap_tokens: usize,
    /// File of API keys, one a line; /v1/* then needs `Authorization: Bearer <key>`
    #[arg(long, env = "EMBEDFLEET_GATEWAY_API_KEYS_FILE", default_value = "")]
    pub api_keys_file: String,
    /// How often the API keys file is re-read
    #[arg(long, env = "EMBEDFLEET_GATEWAY_API_KEYS_RELOAD_SECONDS", default_value_t = 1.0,
          value_parser = seconds(0.01))]
    pub api_keys_reload_seconds: f64,
    /// Count requests per API key (labelled by a digest of the key, never the key)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_API_KEY_METRICS", default_value_t = false,
          action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub api_key_metrics: bool,
    /// Worker addresses, host:port,...
    #[arg(long, env = "EMBEDFLEET_GATEWAY_WORKERS", default_value = "",
          hide_default_value = true, value_parser = addresses)]
    pub workers: Addresses,
    /// File of worker addresses, one a line, re-read when it changes
    #[arg(long, env = "EMBEDFLEET_GATEWAY_WORKERS_FILE", default_value = "")]
    pub workers_file: String,
    /// Kubernetes Service, [NAMESPACE/]NAME, whose EndpointSlices list the workers
    #[arg(long, env = "EMBEDFLEET_GATEWAY_K8S_SERVICE", default_value = "")]
    pub k8s_service: String,
    /// The Service's port name of a worker (further engines of a pod: NAME-1, NAME-2, ...)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_K8S_PORT_NAME", default_value = "grpc")]
    pub k8s_port_name: String,
    /// kubeconfig for the EndpointSlice watch (empty: the pod's service account, else $KUBECONFIG)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_KUBECONFIG", default_value = "")]
    pub kubeconfig: String,
    /// Most inputs (or documents, or pairs) in one request
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_CLIENT_BATCH", default_value_t = 2048,
          value_parser = at_least::<usize>(1.0))]
    pub max_client_batch: usize,
    /// Most tokens in one request
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_REQUEST_TOKENS", default_value_t = 1_000_000,
          value_parser = at_least::<usize>(1.0))]
    pub max_request_tokens: usize,
    /// Most bytes of a request body
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = at_least::<usize>(1.0))]
    pub max_body_bytes: usize,
    /// Most bytes of a request's line and headers (431 past it)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_HEADER_BYTES", default_value_t = 64 * 1024,
          value_parser = at_least::<usize>(1024.0))]
    pub max_header_bytes: usize,
    /// Most header fields of a request (431 past it)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_HEADERS", default_value_t = 100,
          value_parser = at_least::<usize>(1.0))]
    pub max_headers: usize,
    /// Most tokens in one chunk sent to a worker
    #[arg(long, env = "EMBEDFLEET_GATEWAY_CHUNK_TOKENS", default_value_t = 8192,
          value_parser = at_least::<usize>(1.0))]
    pub chunk_tokens: usize,
    /// Fewest tokens a request is spread over workers by; a request under it is small (coalesced)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MIN_CHUNK_TOKENS", default_value_t = 512,
          value_parser = at_least::<usize>(1.0))]
    pub min_chunk_tokens: usize,
    /// Most inputs in one chunk
    #[arg(long, env = "EMBEDFLEET_GATEWAY_CHUNK_SEQUENCES", default_value_t = 256,
          value_parser = at_least::<usize>(1.0))]
    pub chunk_sequences: usize,
    /// Seconds of one worker's measured work a chunk holds at most (0: by tokens alone)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_CHUNK_SECONDS", default_value_t = 1.0,
          value_parser = seconds(0.0))]
    pub chunk_seconds: f64,
    /// Small calls in flight to a worker before the next ones merge (empty: by its device)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_COALESCE_INFLIGHT", default_value = "",
          value_parser = unset_or(at_least::<usize>(0.0)))]
    // Spelled out: clap's derive reads a plain `Option` as "the flag may be absent".
    pub coalesce_inflight: ::std::option::Option<usize>,
    /// Small calls as messages of one EmbedStream per worker, not each a unary call
    #[arg(long, env = "EMBEDFLEET_GATEWAY_COALESCE_STREAM", default_value_t = true,
          action = ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub coalesce_stream: bool,
    /// Seconds of work queued ahead past which a request is answered 429
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_QUEUE_SECONDS", default_value_t = 30.0,
          value_parser = seconds(0.0))]
    pub max_queue_seconds: f64,
    /// Requests held while no worker is ready (scale from zero; 0: refuse at once)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_HOLD_REQUESTS", default_value_t = 0,
          value_parser = at_least::<usize>(0.0))]
    pub hold_requests: usize,
    /// Longest a held request waits for a worker
    #[arg(long, env = "EMBEDFLEET_GATEWAY_HOLD_SECONDS", default_value_t = 120.0,
          value_parser = seconds(0.0))]
    pub hold_seconds: f64,
    /// Threads tokenizing large requests off the event loop
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TOKENIZE_THREADS", default_value_t = 2,
          value_parser = at_least::<usize>(1.0))]
    pub tokenize_threads: usize,
    /// Requests of fewer characters are tokenized on the event loop
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TOKENIZE_INLINE_CHARS", default_value_t = 16 * 1024,
          value_parser = at_least::<usize>(0.0))]
    pub tokenize_inline_chars: usize,
    /// Requests of at least this many characters are tokenized one at a time
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TOKENIZE_LARGE_CHARS", default_value_t = 65536,
          value_parser = at_least::<usize>(0.0))]
    pub tokenize_large_chars: usize,
    /// Least Retry-After of a 429 or 503
    #[arg(long, env = "EMBEDFLEET_GATEWAY_RETRY_AFTER_SECONDS", default_value_t = 1,
          value_parser = at_least::<u64>(0.0))]
    pub retry_after_seconds: u64,
    /// How long a failing worker is taken out of rotation
    #[arg(long, env = "EMBEDFLEET_GATEWAY_EJECT_SECONDS", default_value_t = 5.0,
          value_parser = seconds(0.0))]
    pub eject_seconds: f64,
    /// Deadline of one call to a worker
    #[arg(long, env = "EMBEDFLEET_GATEWAY_UPSTREAM_TIMEOUT_SECONDS", default_value_t = 60.0,
          value_parser = seconds(0.01))]
    pub upstream_timeout_seconds: f64,
    /// How often each worker is asked for its readiness and capacity
    #[arg(long, env = "EMBEDFLEET_GATEWAY_PROBE_SECONDS", default_value_t = 2.0,
          value_parser = seconds(0.01))]
    pub probe_seconds: f64,
    /// A request's line and headers must arrive within this (408 past it)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_HEADER_TIMEOUT_SECONDS", default_value_t = 10.0,
          value_parser = seconds(0.0))]
    pub header_timeout_seconds: f64,
    /// A request's body must arrive within this (408 past it)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_BODY_TIMEOUT_SECONDS", default_value_t = 60.0,
          value_parser = seconds(0.0))]
    pub body_timeout_seconds: f64,
    /// An idle kept-alive connection is closed after this
    #[arg(long, env = "EMBEDFLEET_GATEWAY_KEEP_ALIVE_SECONDS", default_value_t = 5.0,
          value_parser = seconds(0.0))]
    pub keep_alive_seconds: f64,
    /// A connection older than this is closed after its next response (0: never)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_CONNECTION_AGE_SECONDS", default_value_t = 300.0,
          value_parser = seconds(0.0))]
    pub max_connection_age_seconds: f64,
    /// Most open connections; past it a new one is answered 503 (0: the open-file limit's)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_MAX_CONNECTIONS", default_value_t = 0,
          value_parser = at_least::<u64>(0.0))]
    pub max_connections: u64,
    /// Address to listen on
    #[arg(long, env = "EMBEDFLEET_GATEWAY_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on
    #[arg(long, env = "EMBEDFLEET_GATEWAY_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Least level of the log lines written
    #[arg(long, env = "EMBEDFLEET_GATEWAY_LOG_LEVEL", default_value = "info",
          value_parser = ["debug", "info", "warning", "error"])]
    pub log_level: String,
    /// Log lines as JSON, as text, or auto (JSON unless stderr is a terminal)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_LOG_FORMAT", default_value = "auto")]
    pub log_format: LogFormat,
    /// OTLP/gRPC collector for traces (empty: the OTEL_EXPORTER_OTLP_* env, else off)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TRACING_ENDPOINT", default_value = "")]
    pub tracing_endpoint: String,
    /// service.name of the traces (empty: OTEL_SERVICE_NAME, else embedfleet-gateway)
    #[arg(
        long,
        env = "EMBEDFLEET_GATEWAY_TRACING_SERVICE_NAME",
        default_value = ""
    )]
    pub tracing_service_name: String,
    /// Fraction of new traces sampled (a client's sampled flag wins)
    #[arg(long, env = "EMBEDFLEET_GATEWAY_TRACING_SAMPLE_RATIO", default_value_t = 1.0,
          value_parser = at_least::<f64>(0.0))]
    pub tracing_sample_ratio: f64,
}

/// Why the settings were refused: one line, or --help's text (a success, on stdout).
pub enum Refused {
    Help(String),
    Bad(String),
}

/// A clap error as one line: `--flag: why` for a bad value, `unknown setting --flag`.
fn one_line(e: &clap::Error) -> String {
    let flag = e.get(ContextKind::InvalidArg).map(|a| a.to_string());
    let flag = flag.as_deref().and_then(|a| a.split([' ', '=']).next());
    match (e.kind(), flag, std::error::Error::source(e)) {
        (ErrorKind::ValueValidation, Some(flag), Some(why)) => return format!("{flag}: {why}"),
        (ErrorKind::UnknownArgument, Some(flag), _) => return format!("unknown setting {flag}"),
        _ => {}
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("");
    first.trim_start_matches("error: ").to_string()
}

impl Settings {
    /// The settings of `args` (the program name first) and the environment.
    pub fn from_args<I, T>(args: I) -> Result<Settings, Refused>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let s = Settings::try_parse_from(args).map_err(|e| match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                Refused::Help(e.render().to_string())
            }
            _ => Refused::Bad(one_line(&e)),
        })?;
        if !s.names_workers() && s.models_file.is_empty() {
            return Err(Refused::Bad(
                "name the workers: --workers host:port,..., --workers-file PATH or \
                 --k8s-service [NAMESPACE/]NAME (or --models-file PATH)"
                    .into(),
            ));
        }
        Ok(s)
    }

    /// Whether these settings say where workers are.
    pub fn names_workers(&self) -> bool {
        !(self.workers.0.is_empty() && self.workers_file.is_empty() && self.k8s_service.is_empty())
    }

    /// These settings with `flags` (`--name value` pairs) applied over them, each checked as
    /// the command line's; the workers are the flags' alone (a models file's entry).
    pub fn overridden(&self, flags: &[String]) -> Result<Settings, String> {
        // Without defaults and env, the matches hold only what `flags` give.
        let command = Settings::command().mut_args(|a| {
            a.default_value(None::<&str>)
                .env(None::<&str>)
                .required(false)
        });
        let argv = std::iter::once("embedfleet-gateway".to_string()).chain(flags.to_vec());
        let matches = command
            .try_get_matches_from(argv)
            .map_err(|e| one_line(&e))?;
        let mut s = Settings {
            workers: Addresses::default(),
            workers_file: String::new(),
            k8s_service: String::new(),
            ..self.clone()
        };
        s.update_from_arg_matches(&matches)
            .map_err(|e| one_line(&e))?;
        Ok(s)
    }
}

/// A setting's least value, read from its own refusal of a very negative number.
fn minimum(long: &str) -> Option<String> {
    let argv = ["gw", &format!("--{long}"), "-1e300"];
    let refused = Settings::command().try_get_matches_from(argv).err()?;
    one_line(&refused)
        .split_once("is below the minimum, ")
        .map(|(_, least)| least.to_string())
}

/// Every setting as a markdown table (contract/settings.md).
pub fn markdown() -> String {
    let command = Settings::command();
    let mut out = String::from(
        "# Settings\n\n\
         Generated from `gateway/src/settings.rs` (`cargo test` checks it is current; \
         `EMBEDFLEET_UPDATE_CONTRACT=1 cargo test` rewrites it). Each setting is a flag and an \
         env var (a flag wins). A number below its minimum stops the start with one line. \
         \"Per model\": an entry of `--models-file` may set it for its own model.\n\n\
         | flag | env var | default | minimum | per model | what it sets |\n\
         |---|---|---|---|---|---|\n",
    );
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if long == "help" {
            continue;
        }
        let env = arg
            .get_env()
            .map_or(String::new(), |e| e.to_string_lossy().into_owned());
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = match default.join(",") {
            d if d.is_empty() => String::new(),
            d => format!("`{d}`"),
        };
        let per_model = if PER_MODEL.contains(&long.replace('-', "_").as_str()) {
            "yes"
        } else {
            ""
        };
        let help = arg.get_help().map_or(String::new(), |h| h.to_string());
        let _ = writeln!(
            out,
            "| `--{long}` | `{env}` | {default} | {} | {per_model} | {} |",
            minimum(long).unwrap_or_default(),
            help.replace('|', "\\|"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<Settings, String> {
        let argv = std::iter::once("gw").chain(args.iter().copied());
        Settings::from_args(argv).map_err(|e| match e {
            Refused::Help(text) | Refused::Bad(text) => text,
        })
    }

    #[test]
    fn every_env_var_is_the_prefix_and_the_flag() {
        for arg in Settings::command().get_arguments() {
            let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
                assert_eq!(arg.get_long(), Some("help"));
                continue;
            };
            let want = format!("{ENV_PREFIX}{}", long.replace('-', "_").to_uppercase());
            assert_eq!(env.to_string_lossy(), want);
        }
        Settings::command().debug_assert();
    }

    #[test]
    fn booleans_take_a_value() {
        let on = load(&["--workers", "a:1", "--api-key-metrics", "Yes"]);
        assert!(on.unwrap().api_key_metrics);
        let off = load(&["--workers", "a:1", "--api-key-metrics=0"]);
        assert!(!off.unwrap().api_key_metrics);
        let bad = load(&["--workers", "a:1", "--api-key-metrics", "2"]);
        assert!(bad.unwrap_err().contains("--api-key-metrics"));
    }

    #[test]
    fn below_a_minimum_or_nan_is_refused_in_one_line() {
        assert_eq!(
            load(&["--workers", "a:1", "--probe-seconds", "0"]).unwrap_err(),
            "--probe-seconds: 0 is below the minimum, 0.01"
        );
        let nan = load(&["--workers", "a:1", "--upstream-timeout-seconds", "NaN"]);
        assert!(nan.unwrap_err().contains("below the minimum"));
        let s = load(&[
            "--workers",
            "a:1",
            "--probe-seconds",
            "0.01",
            "--chunk-tokens",
            "1",
        ]);
        let s = s.unwrap();
        assert_eq!((s.probe_seconds, s.chunk_tokens), (0.01, 1));
        for bad in ["-1", "nan", "inf", "x"] {
            let e = load(&["--workers", "a:1", "--keep-alive-seconds", bad]).unwrap_err();
            assert!(e.starts_with("--keep-alive-seconds: "), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn workers_are_named_by_a_flag_or_a_models_file() {
        assert_eq!(
            load(&["--models-file", "m.json"]).unwrap().models_file,
            "m.json"
        );
        assert_eq!(
            load(&["--workers", "a:1, ,b:2"]).unwrap().workers.0,
            ["a:1", "b:2"]
        );
        assert_eq!(
            load(&["--no-such-flag", "1"]).unwrap_err(),
            "unknown setting --no-such-flag"
        );
        assert_eq!(
            load(&["--workers", "a:1", "--no-such-flag=1"]).unwrap_err(),
            "unknown setting --no-such-flag"
        );
        assert!(load(&[]).unwrap_err().starts_with("name the workers"));
    }

    #[test]
    fn a_later_flag_wins_and_an_empty_optional_is_unset() {
        let s = load(&["--workers", "a:1", "--port", "1", "--port", "2"]).unwrap();
        assert_eq!(s.port, 2);
        assert_eq!(s.coalesce_inflight, None);
        let s = load(&["--workers", "a:1", "--coalesce-inflight", "3"]).unwrap();
        assert_eq!(s.coalesce_inflight, Some(3));
        let s = load(&["--workers", "a:1", "--coalesce-inflight", ""]).unwrap();
        assert_eq!(s.coalesce_inflight, None);
    }

    #[test]
    fn overrides_apply_only_what_they_name() {
        let base = load(&["--workers", "a:1", "--chunk-tokens", "100"]).unwrap();
        let flags = ["--hold-requests", "8", "--k8s-service", "ns/b"].map(String::from);
        let s = base.overridden(&flags).unwrap();
        assert_eq!((s.hold_requests, s.chunk_tokens), (8, 100));
        assert_eq!((s.workers.0.len(), s.k8s_service.as_str()), (0, "ns/b"));
        let e = base.overridden(&["--chunk-tokens".into(), "0".into()]);
        assert_eq!(e.unwrap_err(), "--chunk-tokens: 0 is below the minimum, 1");
    }

    #[test]
    fn the_table_shows_minimums_and_per_model_settings() {
        let table = markdown();
        assert!(table
            .contains("| `--probe-seconds` | `EMBEDFLEET_GATEWAY_PROBE_SECONDS` | `2` | 0.01 |"));
        assert!(table.contains(
            "| `--hold-requests` | `EMBEDFLEET_GATEWAY_HOLD_REQUESTS` | `0` | 0 | yes |"
        ));
    }
}
