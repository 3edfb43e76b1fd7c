"""The operator's health endpoint, served from the start, leader or not.

kopf's own liveness endpoint starts only once every startup handler has finished, and a standby
replica stays in the startup handler until it holds the Lease (handlers.py): it would never be
Ready and its liveness probe would restart it over and over. This endpoint answers on the
operator's event loop, so a loop that stopped answering still fails the probe, as kopf's does.
"""

from __future__ import annotations

from aiohttp import web

PATH = "/healthz"


async def serve(port: int, leading: dict[str, bool]) -> web.AppRunner:
    """GET /healthz -> 200 {"leader": bool} on 0.0.0.0:`port`; `leading` is read per request."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"leader": leading.get("leader", False)})

    app = web.Application()
    app.router.add_get(PATH, healthz)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    # Every address: the kubelet probes the pod IP.
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
