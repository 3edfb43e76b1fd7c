"""`embedfleet-gateway`: the HTTP gateway in front of a fleet of workers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import uvicorn

from embedfleet.common import logs
from embedfleet.common.settings import load
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings

log = logging.getLogger(__name__)


def serve(settings: GatewaySettings) -> None:
    logs.configure(settings.log_level)
    app = Gateway(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # Measured fastest of the candidates (docs/gateway.md): uvloop + httptools.
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=10,
    )
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
