"""The gateway's one config object: every field is a flag and an env var (EMBEDFLEET_GATEWAY_*)."""

from __future__ import annotations

from dataclasses import dataclass

from embedfleet.common.modeldir import TASK_HELP, TASKS
from embedfleet.common.settings import setting
from embedfleet.common.tracing import ENDPOINT_HELP, SAMPLE_HELP, SERVICE_HELP

ENV_PREFIX = "EMBEDFLEET_GATEWAY_"


@dataclass(frozen=True)
class GatewaySettings:
    # --- model -----------------------------------------------------------------------------
    model: str = setting(
        "",
        "Model directory (for its tokenizer, prompts and limits) or file:// URL; empty uses the "
        "bundled all-MiniLM-L6-v2. Must be the model the workers serve.",
    )
    task: str = setting(
        "auto", TASK_HELP + " Keep equal to the workers' task.", choices=("auto", *TASKS)
    )
    served_model_name: str = setting(
        "", "Name clients pass as `model`; empty uses the model's own name (config _name_or_path)."
    )
    max_input_tokens: int = setting(
        0,
        "Longest single input in tokens; 0 uses the model's default (sentence-transformers "
        "max_seq_length, else its position limit). Keep equal to the workers' limit.",
    )
    quantization_file: str = setting(
        "",
        "int8/uint8 calibration file (`embedfleet calibrate` writes one); empty uses the model "
        "directory's embedfleet_quantization.json, else the bundled model's shipped ranges. "
        "Without ranges, int8 and uint8 requests are refused with 400.",
    )
    models_file: str = setting(
        "",
        "Serve several models (a shared gateway): a JSON file listing each model's own settings "
        '(model, served_model_name, its workers, ...; see docs/gateway.md "Several models"), '
        "routed by the request's `model`. Empty: the one model of the settings above.",
    )
    # --- long inputs -----------------------------------------------------------------------
    split_long_inputs: bool = setting(
        False,
        "Default of the request field `split_long_inputs`: embed an input over the model's limit "
        "as overlapping windows and return their token-weighted mean (instead of a 400). "
        '`"truncate": true` in a request still cuts.',
    )
    split_overlap_tokens: int = setting(
        32,
        "Tokens each window of a split input shares with the previous one (at most half a window).",
        minimum=0,
    )
    # --- auth ------------------------------------------------------------------------------
    api_keys_file: str = setting(
        "",
        "File of API keys, one a line (blank lines and # comments ignored). When set, /v1/* "
        "needs `Authorization: Bearer <key>`; the file is re-read when it changes (a mounted "
        "Secret's update included), no restart. Empty: no auth.",
    )
    api_keys_reload_seconds: float = setting(
        1.0,
        "How often the API keys file is checked for a change.",
        minimum=0.01,
    )
    api_key_metrics: bool = setting(
        False,
        "Count requests per API key (embedfleet_gateway_key_requests_total), labelled by the "
        "first 12 hex digits of the key's sha256, never the key.",
    )
    # --- workers ---------------------------------------------------------------------------
    workers: tuple[str, ...] = setting(
        (), "Static worker gRPC addresses host:port, comma-separated."
    )
    workers_file: str = setting(
        "",
        "File listing worker addresses (one per line, # comments); re-read when it changes, so "
        "workers can be added and removed live.",
    )
    k8s_service: str = setting(
        "",
        "Discover workers from the EndpointSlices of this Kubernetes Service, as NAMESPACE/NAME "
        "(or NAME in the pod's own namespace); watched live.",
    )
    k8s_port_name: str = setting(
        "grpc", "Port name in the Service's EndpointSlices that carries the worker gRPC API."
    )
    kubeconfig: str = setting(
        "",
        "Kubeconfig for --k8s-service; empty uses the in-cluster service account (or $KUBECONFIG).",
    )
    # --- limits ----------------------------------------------------------------------------
    max_client_batch: int = setting(
        2048, "Most inputs (or documents, or pairs) in one request.", minimum=1
    )
    max_request_tokens: int = setting(
        1_000_000,
        "Most tokens in one request after tokenization; more is refused with 413.",
        minimum=1,
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024,
        "Largest request body in bytes; more is refused with 413.",
        minimum=1,
    )
    # --- splitting and balancing -----------------------------------------------------------
    chunk_tokens: int = setting(
        8192,
        "Token budget of one chunk sent to a worker. A large request is split into chunks of at "
        "most this many tokens (smaller when that spreads it over more workers).",
        minimum=1,
    )
    min_chunk_tokens: int = setting(
        512,
        "Requests are split to spread over workers only into chunks of at least this size.",
        minimum=1,
    )
    chunk_sequences: int = setting(256, "Most inputs in one chunk.", minimum=1)
    chunk_seconds: float = setting(
        1.0,
        "A chunk also holds at most this many seconds of one worker's work at the workers' "
        "measured capacity (never below --min-chunk-tokens): a slow CPU worker's last large "
        "chunk would leave the others idle; 0 keeps --chunk-tokens.",
        minimum=0,
    )
    max_queue_seconds: float = setting(
        30.0,
        "Admission: a request is taken while the work queued ahead of it (admitted, not yet "
        "answered, in seconds at the workers' measured capacity) is within this; beyond it, it "
        "gets 429 with Retry-After. Keep it below --upstream-timeout-seconds by the longest "
        "request's own work, so admitted requests finish within their deadline.",
        minimum=0,
    )
    retry_after_seconds: int = setting(
        1,
        "Least Retry-After sent with 429 (a shed request is told the seconds until the queue is "
        "back within --max-queue-seconds, when that is more).",
        minimum=0,
    )
    hold_requests: int = setting(
        0,
        "Scale from zero: while no worker is ready, hold up to this many requests until one is "
        "(their count and tokens are gauges the autoscaler reads as demand), and keep /ready OK so "
        "the gateway stays in its Service. More get 503 with Retry-After. 0: no hold; no ready "
        "worker means 503 at once and /ready fails.",
        minimum=0,
    )
    hold_seconds: float = setting(
        120.0,
        "Longest a request is held waiting for a ready worker; then 503 with Retry-After. Cover "
        "a worker's cold start (pod start, weights, warm-up, self-check).",
        minimum=0,
    )
    eject_seconds: float = setting(
        5.0,
        "A worker whose call failed with UNAVAILABLE or a broken connection is skipped this long.",
        minimum=0,
    )
    upstream_timeout_seconds: float = setting(
        60.0, "Deadline of one chunk's call to a worker.", minimum=0.01
    )
    coalesce_inflight: int | None = setting(
        None,
        "Embed calls of small chunks (under --min-chunk-tokens) in flight to one worker before "
        "the next small chunks wait and travel merged into one message (up to --chunk-tokens and "
        "--chunk-sequences), so under load short queries pay gRPC's per-call CPU once per "
        'message, not once each (docs/gateway.md, "Coalescing"). Below it a chunk is sent at '
        "once; larger chunks always are. 0: every chunk is its own call. Unset: by the device "
        "the worker reports, 1 for a CPU, 2 for an accelerator (whose worker packs the next "
        "batch while the device runs one).",
        minimum=0,
    )
    probe_seconds: float = setting(
        2.0,
        "How often each worker's Info (readiness, queue, model facts) is polled.",
        minimum=0.01,
    )
    # --- tokenization ----------------------------------------------------------------------
    tokenize_threads: int = setting(
        2,
        "Threads that run the tokenizer off the event loop (the batch API is itself parallel).",
        minimum=1,
    )
    tokenize_inline_chars: int = setting(
        256,
        "Requests with fewer characters of text than this are tokenized on the event loop: the "
        "thread hop costs more than the work (see docs/gateway.md).",
        minimum=0,
    )
    tokenize_large_chars: int = setting(
        65536,
        "Requests with at least this many characters of text are tokenized on a lane (thread) of "
        "their own, so a huge request never delays the others.",
        minimum=0,
    )
    # --- serving ---------------------------------------------------------------------------
    header_timeout_seconds: float = setting(
        10.0,
        "A connection must send a request's complete headers within this long of opening (or of "
        "the next request's first byte); else it gets 408 and is closed (slow-client defence).",
        minimum=0,
    )
    body_timeout_seconds: float = setting(
        60.0,
        "A request's body must arrive within this long after its headers; else 408 and the "
        "connection is closed.",
        minimum=0,
    )
    keep_alive_seconds: float = setting(
        5.0,
        "An idle kept-alive connection is closed after this long without a new request.",
        minimum=0,
    )
    max_connection_age_seconds: float = setting(
        300.0,
        "A kept-alive connection this old is closed after its next response (with `Connection: "
        "close`, so the client never sends on a closing socket): clients reconnect, and a "
        "Service spreads them over the gateway pods a rollout or a scale-up added. Drawn per "
        "connection from the last tenth of the bound; 0: never.",
        minimum=0,
    )
    max_connections: int = setting(
        0,
        "Open HTTP connections beyond this are answered 503 and closed at once, so idle sockets "
        "cannot use up the file descriptors; 0 (and any larger value) means the process's "
        "open-file limit less 64.",
        minimum=0,
    )
    host: str = setting("127.0.0.1", "Address the HTTP server binds.")
    port: int = setting(8080, "HTTP port.")
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    # --- tracing (OpenTelemetry; see docs/gateway.md "Tracing") ----------------------------
    tracing_endpoint: str = setting("", ENDPOINT_HELP)
    tracing_sample_ratio: float = setting(1.0, SAMPLE_HELP)
    tracing_service_name: str = setting("", SERVICE_HELP.format(default="embedfleet-gateway"))
