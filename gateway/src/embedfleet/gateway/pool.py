"""The live set of workers: one gRPC client each, polled for readiness and load."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.balancer import Balancer, Endpoint
from embedfleet.gateway.client import UpstreamError, WorkerClient

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, balancer: Balancer, probe_seconds: float) -> None:
        self.balancer = balancer
        self.probe_seconds = probe_seconds
        self.clients: dict[str, WorkerClient] = {}
        self.infos: dict[str, pb.InfoResponse] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    def update(self, addresses: Collection[str]) -> None:
        added, removed = self.balancer.set_addresses(addresses)
        for address in removed:
            self._probes.pop(address).cancel()
            self.infos.pop(address, None)
            client = self.clients.pop(address)
            # Let calls in flight finish briefly; the rest fail over to other workers.
            task = asyncio.create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        for address in added:
            self.clients[address] = WorkerClient(address)
            self._probes[address] = asyncio.create_task(self._probe_loop(address))
        if added or removed:
            log.info(
                "workers changed",
                extra={"added": sorted(added), "removed": sorted(removed)},
            )

    def endpoint(self, address: str) -> Endpoint | None:
        return self.balancer.endpoints.get(address)

    def ready(self) -> bool:
        return any(e.ready for e in self.balancer.endpoints.values())

    def info(self) -> pb.InfoResponse | None:
        """Model facts from any worker that has answered."""
        return next(iter(self.infos.values()), None)

    async def _probe_once(self, address: str) -> None:
        endpoint = self.balancer.endpoints.get(address)
        client = self.clients.get(address)
        if endpoint is None or client is None:
            return
        try:
            info = await client.info(timeout=max(1.0, self.probe_seconds))
        except UpstreamError as exc:
            if endpoint.ready:
                log.warning(
                    "worker not answering", extra={"worker": address, "code": exc.code.name}
                )
            endpoint.ready = False
            return
        was = endpoint.ready
        endpoint.ready = info.ready and not info.draining
        endpoint.queued_tokens = int(info.queued_tokens)
        self.infos[address] = info
        if endpoint.ready != was:
            log.info("worker readiness", extra={"worker": address, "ready": endpoint.ready})
            self._changed.set()

    async def _probe_loop(self, address: str) -> None:
        while True:
            await self._probe_once(address)
            # Poll fast until the worker is first ready, so a new replica takes traffic quickly.
            endpoint = self.balancer.endpoints.get(address)
            fast = endpoint is not None and not endpoint.ready and address not in self.infos
            await asyncio.sleep(min(0.2, self.probe_seconds) if fast else self.probe_seconds)

    async def wait_ready(self, timeout: float) -> bool:
        async with asyncio.timeout(timeout):
            while not self.ready():
                self._changed.clear()
                await self._changed.wait()
        return True

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        for task in self._probes.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probes.clear()
        await asyncio.gather(*(c.close() for c in self.clients.values()), *self._closing)
        self.clients.clear()
