"""`embedfleet-gateway`: the HTTP gateway in front of a fleet of workers."""

from __future__ import annotations

import logging
import math
import resource
from collections.abc import Sequence
from typing import Literal

import uvicorn

from embedfleet.common import heap, logs
from embedfleet.common.settings import load
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.connection import bounded_protocol
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings

log = logging.getLogger(__name__)


#: file descriptors kept out of --max-connections: worker channels, the log, the listening socket
FD_RESERVE = 64


def connection_cap(wanted: int, open_files: int) -> int:
    """--max-connections (0: no cap of its own), kept below the open-file limit so that refusing
    stays possible."""
    room = max(1, open_files - FD_RESERVE)
    return min(wanted, room) if wanted > 0 else room


def server_config(
    app: Gateway, settings: GatewaySettings, loop: Literal["uvloop", "asyncio"] = "uvloop"
) -> uvicorn.Config:
    """uvicorn as the gateway runs it: httptools (bounded, connection.py) and these settings."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    cap = connection_cap(settings.max_connections, soft)
    if cap < settings.max_connections:
        log.warning(
            "max connections lowered to fit the open-file limit",
            extra={"max_connections": cap, "open_files": soft},
        )
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # Measured fastest of the candidates (docs/gateway.md): uvloop + httptools.
        loop=loop,
        http=bounded_protocol(
            settings.header_timeout_seconds, cap, settings.max_connection_age_seconds
        ),
        timeout_keep_alive=settings.keep_alive_seconds,  # type: ignore[arg-type]
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        # After SIGTERM, requests in flight may run to their own deadline (admission keeps the
        # queue within it); the pod's grace period covers this, the pre-stop sleep and a margin.
        timeout_graceful_shutdown=math.ceil(settings.upstream_timeout_seconds),
    )


def serve(settings: GatewaySettings) -> None:
    logs.configure(settings.log_level)
    config = server_config(Gateway(settings), settings)
    # Imports and the tokenizer are in: never walked by a collection again. Here, in the
    # process's entry point, not the app's lifespan: tests run the app in their own process.
    heap.settle()
    log.info("gateway listening", extra={"host": settings.host, "port": settings.port})
    uvicorn.Server(config).run()


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(
        GatewaySettings,
        ENV_PREFIX,
        argv,
        prog="embedfleet-gateway",
        description="OpenAI-compatible embeddings gateway: tokenizes, splits, balances.",
    )
    serve(settings)


if __name__ == "__main__":
    main()
