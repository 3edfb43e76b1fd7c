"""An ASGI factory for running the gateway under any ASGI server, configured by env vars only.

`embedfleet-gateway` (cli.py) runs the measured-fastest server itself; this entry point exists so
the benchmark can put other servers (granian, ...) in front of the same app, e.g.
``granian --interface asgi --factory embedfleet.gateway.asgi:create_app``.
"""

from __future__ import annotations

from embedfleet.common import logs
from embedfleet.common.settings import load
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings


def create_app() -> Gateway:
    settings = load(GatewaySettings, ENV_PREFIX, argv=[])
    logs.configure(settings.log_level)
    return Gateway(settings)
