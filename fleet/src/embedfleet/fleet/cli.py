"""`embedfleet`: the local fleet (`embedfleet serve`: supervisor.py) and `embedfleet calibrate`
(calibrate.py), each a subcommand."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from embedfleet.common import logs
from embedfleet.common.exits import EXIT_REFUSED
from embedfleet.common.logs import LOG_FORMATS
from embedfleet.common.modeldir import TASKS
from embedfleet.fleet import calibrate
from embedfleet.fleet.binary import (
    BINARY,
    BINARY_ENV,
    FRONT_LIBRARY_ENV,
    UnbuiltError,
)
from embedfleet.fleet.supervisor import (
    SUPERVISE_SECONDS,
    Fleet,
    FleetError,
    kept_openvino_args,
    served_model,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedfleet", description="embedfleet on this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="Run a gateway and N workers on 127.0.0.1 until Ctrl-C."
    )
    serve.add_argument(
        "--model",
        action="append",
        default=[],
        help="Model directory; default: the bundled all-MiniLM-L6-v2. Repeat it to serve "
        "several models behind one gateway, routed by the request's `model`, each as NAME=PATH "
        "(or PATH, under the model's own name) on --workers workers of its own.",
    )
    serve.add_argument(
        "--task",
        default="auto",
        choices=("auto", *TASKS),
        help="What to serve the model as, for the workers and the gateway alike (default auto: "
        "from config.json; score makes a Qwen3ForCausalLM a yes/no reranker).",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=0,
        help="Worker processes (default 0: from the usable cores, affinity and cgroup quota; one "
        "worker per 4 cores, each with its share of them as torch threads).",
    )
    serve.add_argument("--port", type=int, default=8080, help="Gateway HTTP port (default 8080).")
    serve.add_argument(
        "--api-keys-file",
        default="",
        help="File of API keys, one a line; the gateway then requires `Authorization: Bearer` "
        "and re-reads the file when it changes.",
    )
    serve.add_argument(
        "--log-format",
        default="auto",
        choices=LOG_FORMATS,
        help="The children's log lines: json, text (each after its child's name), or auto "
        "(default: text at a terminal, else json).",
    )
    serve.add_argument(
        "--start-timeout",
        type=float,
        default=180.0,
        help="Seconds to wait for every worker to be in rotation before giving up (default "
        "180). A large model on a CPU loads, converts and warms up for longer.",
    )
    serve.add_argument(
        "--gateway-binary",
        default="",
        help=f"The gateway binary (default: ${BINARY_ENV}, else {BINARY} on PATH, else this "
        "clone's build, which `make install` makes).",
    )
    serve.add_argument(
        "--worker-front",
        default="rust",
        choices=("rust", "python"),
        help="The workers' gRPC front (default rust: worker-front/, from "
        f"${FRONT_LIBRARY_ENV}, else the installed embedfleet_front, else this clone's build, "
        "which `make install` makes; python: the grpc asyncio front).",
    )
    calibrate.add_arguments(
        commands.add_parser(
            "calibrate",
            help="Compute int8/uint8 calibration ranges through a running gateway.",
        )
    )
    return parser


def port_free(port: int) -> bool:
    """Whether the gateway could listen on `port` now (its own bind says no with a traceback-free
    line too, but only after every worker started)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def refusal(model: str, task: str) -> str | None:
    """The worker's refusal of `model` for `task` (its one line), or None when it serves it:
    asked of the worker's own check in a process, as the fleet's workers would ask it."""
    done = subprocess.run(
        [sys.executable, "-m", "embedfleet.worker.architectures", model, task],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != EXIT_REFUSED:
        return None
    return done.stderr.strip().splitlines()[-1]


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "calibrate":
        calibrate.run(args)
        return
    if args.workers < 0:
        raise SystemExit("--workers must be at least 1 (or 0: from the cores)")
    if args.api_keys_file and not Path(args.api_keys_file).is_file():
        raise SystemExit(f"--api-keys-file {args.api_keys_file}: no such file")
    for value in args.model:
        path = served_model(value)[1]
        if not Path(path).expanduser().is_dir():
            raise SystemExit(f"--model {path}: no such directory (a model directory, or NAME=DIR)")
        # The workers would refuse it too, but only after the gateway failed on it less clearly.
        model = str(Path(path).expanduser()) if path else ""  # "": the bundled model
        if (refused := refusal(model, args.task)) is not None:
            raise SystemExit(f"embedfleet serve: {refused}")
    if not port_free(args.port):
        raise SystemExit(
            f"embedfleet serve: port {args.port} is in use; stop what holds it or choose "
            "another with --port"
        )
    text = not logs.is_json(args.log_format, sys.stderr)
    stop = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # While starting, a signal unwinds start(), which stops the children it already spawned.
    signal.signal(signal.SIGTERM, interrupt)
    task = ("--task", args.task)
    kept = kept_openvino_args()
    keys = (
        ["--api-keys-file", str(Path(args.api_keys_file).absolute())] if args.api_keys_file else []
    )
    several = len(args.model) > 1
    name, path = served_model(args.model[0]) if len(args.model) == 1 else ("", "")
    named = ("--served-model-name", name) if name else ()
    fleet = Fleet(
        workers=args.workers,
        model=path,
        models=tuple(args.model) if several else (),
        port=args.port,
        worker_args=(*task, *kept),
        gateway_args=(*task, *keys, *named),
        gateway_binary=args.gateway_binary,
        front=args.worker_front,
        log_format="text" if text else "json",
        prefix=text,
    )
    try:
        fleet.plan()
        print(f"starting a gateway and {fleet.workers} worker(s) ...", flush=True)
        fleet.start(args.start_timeout)
    except (FleetError, UnbuiltError) as exc:
        raise SystemExit(f"embedfleet serve: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"embedfleet is serving at {fleet.url}  (OpenAI base_url {fleet.url}/v1)", flush=True)
    print("Ctrl-C stops it.", flush=True)
    try:
        while not stop.wait(SUPERVISE_SECONDS):
            for event in fleet.supervise():
                print(event, flush=True)
    finally:
        fleet.stop()
    print("stopped.", flush=True)


if __name__ == "__main__":
    main()
