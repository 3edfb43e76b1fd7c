"""The autoscaler's writes (status.autoscaling and Events), made off its tick.

With the writes inside the tick, a tick over a thousand fleets lasted as long as a thousand
writes on a loaded API server (52 s measured, against a 5 s interval), so each fleet was decided
about once a minute and its policy windows got a point as rarely. Here a tick only decides and
hands its writes over; a few writers make them as fast as the API server answers:

- one pending status write per fleet, the latest replacing an older one not yet made (each is
  the whole status.autoscaling: nothing is lost by skipping one);
- decisions before measurement refreshes (`memory.py`), so a scale-up never waits behind a
  thousand refreshes;
- Events in the order posted, before either.

A write that fails is logged and dropped: the fleet's memory still holds what was last written,
so the next tick finds it due again. The log keeps one line per FAILURE_LOG_SECONDS of each kind
(with the count held back): an API server down for a minute fails every fleet's write every tick,
which at a thousand fleets was 200 lines a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from embedfleet.common.logs import LogLimiter
from embedfleet.operator import paths
from embedfleet.operator.autoscaling.memory import Fleet, Memory
from embedfleet.operator.kube import Kube, KubeError
from embedfleet.operator.metrics import STATUS_WRITES
from embedfleet.operator.status import mirrored
from embedfleet.operator.workqueue import Lanes

log = logging.getLogger(__name__)

DECISION, REFRESH = 0, 1
"""Lanes of status writes, most urgent first."""
#: Writes in flight at once: the API server is shared with the reconciles, which have 16.
WRITERS = 4
FAILURE_LOG_SECONDS = 10.0


class Recorder:
    """Coalescing, prioritised writes of the autoscaler's results (one event loop: no lock)."""

    def __init__(self, kube: Kube, memory: Memory, writers: int = WRITERS) -> None:
        self._kube = kube
        self._memory = memory
        self._writers = writers
        self._lanes = Lanes(2)
        self._patches: dict[tuple[str, str], tuple[Fleet, dict[str, Any], float]] = {}
        self._events: deque[tuple[str, dict[str, Any]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._status_failures = LogLimiter(FAILURE_LOG_SECONDS)
        self._event_failures = LogLimiter(FAILURE_LOG_SECONDS)

    def status(
        self,
        key: tuple[str, str],
        fleet: Fleet,
        patch: Mapping[str, Any] | None,
        decision: bool,
        now: float,
    ) -> None:
        """Writes `patch` into the fleet's status.autoscaling soon; None: nothing is due, and a
        write still pending for it is dropped (what status holds is already right)."""
        if patch is None:
            if self._patches.pop(key, None) is not None:
                self._lanes.remove(key)
            return
        self._patches[key] = (fleet, dict(patch), now)
        self._lanes.add(key, DECISION if decision else REFRESH)
        self._spawn()

    def event(self, namespace: str, body: dict[str, Any]) -> None:
        self._events.append((namespace, body))
        self._spawn()

    def __len__(self) -> int:
        """Writes waiting (status and Events)."""
        return len(self._patches) + len(self._events)

    async def idle(self) -> None:
        """Waits until every write handed over is made (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _spawn(self) -> None:
        if len(self._tasks) < self._writers:
            task = asyncio.get_running_loop().create_task(self._work())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self) -> None:
        while True:
            if self._events:
                namespace, body = self._events.popleft()
                await self._post(namespace, body)
                continue
            entry = self._lanes.pop_entry()
            if entry is None:
                return
            key, lane = entry
            fleet, patch, at = self._patches.pop(key)
            await self._write(key, fleet, patch, at, "decision" if lane == DECISION else "refresh")

    async def _write(
        self, key: tuple[str, str], fleet: Fleet, patch: dict[str, Any], at: float, kind: str
    ) -> None:
        kube = self._kube
        try:
            await kube.call(
                kube.merge_status,
                paths.embedding_deployment(*key),
                {"autoscaling": patch, **mirrored(patch)},
            )
        except Exception as err:  # an I/O shell: this writer goes on with the next write
            STATUS_WRITES.labels(kind, "error").inc()
            # A fleet deleted meanwhile has no status to keep.
            if not (isinstance(err, KubeError) and err.status == 404):
                self._log_failure(
                    self._status_failures, err, "writing the autoscaling status of %s/%s", *key
                )
            return
        STATUS_WRITES.labels(kind, "ok").inc()
        self._memory.wrote(fleet, patch, at)

    async def _post(self, namespace: str, body: dict[str, Any]) -> None:
        kube = self._kube
        try:
            await kube.call(kube.request, "POST", f"/api/v1/namespaces/{namespace}/events", body)
        except Exception as err:  # an I/O shell: this writer goes on with the next write
            self._log_failure(
                self._event_failures, err, "posting an autoscaling Event in %s", namespace
            )

    @staticmethod
    def _log_failure(limiter: LogLimiter, err: Exception, what: str, *args: str) -> None:
        """One line per FAILURE_LOG_SECONDS: an API error as a warning, anything else (a bug)
        as an error with its traceback."""
        if (held := limiter.allow(time.monotonic())) is None:
            return
        known = isinstance(err, KubeError)
        log.log(
            logging.WARNING if known else logging.ERROR,
            what + " failed: %s", *args, err,
            exc_info=not known,
            extra={"since_last_line": held},
        )  # fmt: skip
