"""kopf wiring: thin handlers that feed one work queue; the decisions live in pure modules.

No kopf timers or daemons on EmbeddingDeployments: kopf gives every object with one a finalizer,
and a finalizer blocks deletion while the operator is down. Periodic work runs in a task started
at startup instead. No change handlers either (on.create/update): nothing here needs kopf's
progress storage, which is nevertheless configured to live in annotations so that any handler
that does need it survives the structural schema's pruning of unknown status fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import secrets
import signal
import socket
import threading
import time
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import start_http_server

from embedfleet.operator import health, metrics, paths
from embedfleet.operator.autoscaling import autoscaler
from embedfleet.operator.informer import Bodies, Change, Informer
from embedfleet.operator.kube import Kube, KubeError, in_daemon_thread
from embedfleet.operator.leader import LeaderElector
from embedfleet.operator.manifests import Images
from embedfleet.operator.reconciler import Reconciler
from embedfleet.operator.settings import OperatorSettings, cpu_worker_image
from embedfleet.operator.spec import GROUP, PLURAL, VERSION
from embedfleet.operator.workqueue import (
    CHILD_CHANGED,
    FLEET_CHANGED,
    LANE_NAMES,
    RESYNC,
    Key,
    Queue,
)

log = logging.getLogger(__name__)

# Kinds the operator creates (apiVersion, kind); any change to one of them re-reconciles its
# owner. Watched by informer.py, filtered by label at the API server.
CHILD_KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("policy/v1", "PodDisruptionBudget"),
)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: How long kopf may take to end after our cleanup before the process ends anyway.
EXIT_GRACE_SECONDS = 1.0


def _settings(memo: kopf.Memo) -> OperatorSettings:
    settings = memo["settings"]
    assert isinstance(settings, OperatorSettings)
    return settings


def _queue(memo: kopf.Memo) -> Queue | None:
    queue = memo.get("queue")
    return queue if isinstance(queue, Queue) else None


def lease_namespace(configured: str) -> str:
    if configured:
        return configured
    if pod := os.environ.get("POD_NAMESPACE"):
        return pod
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _configure_kopf(settings: kopf.OperatorSettings, op: OperatorSettings) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
    # A watch the network silently dropped would otherwise hang forever.
    settings.watching.server_timeout = op.watch_server_timeout
    settings.watching.client_timeout = op.watch_client_timeout
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Leader election is ours (see leader.py); kopf's own peering stays off.
    settings.peering.standalone = True
    # kopf would post Events at this level (the operator posts its own, see _run_one); the
    # per-event "handler succeeded" lines are silenced at their logger (cli.py) unless debugging.
    settings.posting.level = logging.INFO


def _failed(count: int = 1) -> None:
    """Counts `count` failed reconciles: the one metric the reconcile-errors alert reads."""
    metrics.RECONCILES.labels(result="error").inc(count)
    metrics.RECONCILE_ERRORS.inc(count)


async def _run_one(reconciler: Reconciler, key: Key) -> bool:
    started = time.monotonic()
    try:
        outcome = await reconciler.kube.call(reconciler.reconcile, *key)
    except Exception:  # a shell around API calls: log, count, retry with backoff
        log.exception("reconcile of %s/%s failed", *key)
        _failed()
        return False
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
    if outcome.body is not None:
        metrics.DESIRED_REPLICAS.labels(*key).set(outcome.desired)
        metrics.READY_REPLICAS.labels(*key).set(outcome.ready)
        # Posted directly, not with kopf.info: kopf's posting needs a context variable that only
        # its per-object handler tasks carry, and the queue's workers are spawned by whichever
        # trigger came first (an informer thread, the resync), so kopf would drop some.
        for note in outcome.events:
            manifest = autoscaler.event(
                outcome.body, note.reason, note.message, time.time(), type=note.type
            )
            path = f"/api/v1/namespaces/{key[0]}/events"
            try:
                await reconciler.kube.call(reconciler.kube.request, "POST", path, manifest)
            except KubeError as err:
                log.warning("posting event %s on %s/%s: %s", note.reason, *key, err)
    if outcome.error:
        _failed()
        return False
    metrics.RECONCILES.labels(result="ok").inc()
    return True


async def resync_once(kube: Kube, queue: Queue, namespace: str) -> bool:
    """Queues every fleet for a reconcile (the resync lane); False when listing them failed.

    A failed listing is a failed reconcile of every fleet this resync was for: counted as one
    (the fleets are unknown), so an operator that cannot even list them still raises the
    reconcile-errors alert instead of only logging."""
    try:
        # resourceVersion=0: from the API server's watch cache, not a quorum read of etcd
        # (a resync repairs what a watch missed; milliseconds of staleness do not matter).
        found = await kube.call(
            kube.request,
            "GET",
            paths.embedding_deployments(namespace),
            query={"resourceVersion": "0"},
        )
    except Exception:
        log.exception("listing EmbeddingDeployments for the periodic resync failed")
        _failed()
        return False
    for item in found.get("items", ()):
        queue.trigger((item["metadata"]["namespace"], item["metadata"]["name"]), RESYNC)
    return True


async def _resync(kube: Kube, queue: Queue, namespace: str, interval: float) -> None:
    """Every fleet, every `interval`, behind anything a watch event queued (the resync lane).

    Cheap when nothing changed: one GET of the fleet, no write (desired.py, status.changed)."""
    while True:
        await asyncio.sleep(interval)
        await resync_once(kube, queue, namespace)


async def _keep_leadership(elector: LeaderElector, memo: kopf.Memo) -> None:
    """Renews the Lease; steps down (stops the operator) once renewal has failed for too long."""
    period = elector.duration / 3
    renewed = time.monotonic()
    while True:
        await asyncio.sleep(period)
        # Not kube.call: a renewal must never queue behind reconciles.
        if await in_daemon_thread(elector.try_acquire):
            renewed = time.monotonic()
        elif time.monotonic() - renewed > elector.duration * 2 / 3:
            log.error("lost the leader lease %s; stopping", elector.name)
            memo["lost_leadership"] = True
            # kopf's own graceful stop; a stop_flag would park a thread the loop then waits on.
            os.kill(os.getpid(), signal.SIGTERM)
            return


async def _acquire(elector: LeaderElector, logger: Any) -> None:
    waiting_logged = False
    retry = max(elector.duration / 5, 0.5)
    while not await in_daemon_thread(elector.try_acquire):
        if not waiting_logged:
            logger.info(f"waiting for the leader lease {elector.namespace}/{elector.name}")
            waiting_logged = True
        await asyncio.sleep(elector.next_attempt_in(retry))
    logger.info(f"acquired the leader lease {elector.namespace}/{elector.name}")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    op = _settings(memo)
    _configure_kopf(settings, op)
    # Room for every reconcile worker, plus the autoscaler's and the resync's calls.
    kube = await in_daemon_thread(Kube.connect, max(Kube.max_calls, op.reconcile_workers + 4))
    memo["kube"] = kube
    tasks: list[asyncio.Task[None]] = []
    memo["tasks"] = tasks
    # Health and metrics first: a standby waits below for the Lease, alive, Ready and scraped.
    leading = {"leader": not op.leader_election}
    if op.health_port:
        memo["health"] = await health.serve(op.health_port, leading)
    if op.metrics_port:
        start_http_server(op.metrics_port)
    metrics.LEADER.set(leading["leader"])
    loop = asyncio.get_running_loop()
    queues: list[Queue] = []

    def child_changed(owner: tuple[str, str]) -> None:  # on an informer thread
        # Before the Lease (no queue yet) a change only updates the cache: the leader's first
        # list of EmbeddingDeployments reconciles every fleet anyway.
        if owner[1] and queues:
            with contextlib.suppress(RuntimeError):  # the loop closed: the operator is stopping
                loop.call_soon_threadsafe(queues[0].trigger, owner, CHILD_CHANGED)

    # Listed and watched while waiting for the Lease (a warm standby, as controller-runtime's
    # caches): a successor's first reconciles compare against a full cache at once instead of
    # first listing every child of every fleet.
    informer = Informer(
        kube, CHILD_KINDS, op.namespace, child_changed, watch_seconds=op.watch_server_timeout
    )
    memo["informer"] = informer
    informer.start()
    if op.leader_election:
        identity = op.identity or f"{socket.gethostname()}_{secrets.token_hex(4)}"
        elector = LeaderElector(
            kube, lease_namespace(op.lease_namespace), op.lease_name, identity, op.lease_seconds
        )
        memo["elector"] = elector
        await _acquire(elector, logger)
        leading["leader"] = True
        metrics.LEADER.set(1)
        tasks.append(asyncio.create_task(_keep_leadership(elector, memo)))
    images = Images(op.worker_image, op.gateway_image, worker_cpu=cpu_worker_image(op))
    holder: list[Reconciler] = []
    queue = Queue(
        lambda key: _run_one(holder[0], key),
        max_backoff=op.resync_seconds,
        workers=op.reconcile_workers,
        waited=lambda lane, seconds: metrics.QUEUE_WAIT_SECONDS.labels(LANE_NAMES[lane]).observe(
            seconds
        ),
    )
    memo["queue"] = queue
    queues.append(queue)
    bodies = Bodies()
    memo["bodies"] = bodies
    holder.append(Reconciler(kube, images, informer, bodies))
    tasks.append(asyncio.create_task(_resync(kube, queue, op.namespace, op.resync_seconds)))
    caches = autoscaler.Caches(informer)
    tasks.append(
        asyncio.create_task(
            autoscaler.run(kube, op.namespace, caches, op.autoscaler_status_seconds)
        )
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stops every task, hands the Lease back, then refuses further API calls.

    Nothing here waits on the API server beyond the release (bounded): the tasks' blocking calls
    are abandoned on their daemon threads (kube.py), and the closed client ends them at their
    next call, so the process exits within the release's round trips, or one renew period when
    the API server does not answer at all.
    """
    tasks: list[asyncio.Task[None]] = list(memo.get("tasks", ()))
    for task in tasks:
        task.cancel()
    if (queue := _queue(memo)) is not None:
        queue.cancel()
        await queue.idle()
    await asyncio.gather(*tasks, return_exceptions=True)
    elector = memo.get("elector")
    if isinstance(elector, LeaderElector):
        # Best effort, bounded by one renew period: a release slower than that is on an API
        # server too slow to matter (the Lease expires anyway), and the exit does not wait for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(in_daemon_thread(elector.release), elector.duration / 3)
    if isinstance(informer := memo.get("informer"), Informer):
        informer.stop()
    if isinstance(kube := memo.get("kube"), Kube):
        kube.close()
    if isinstance(runner := memo.get("health"), web.AppRunner):
        await runner.cleanup()
    # Nothing of ours is left to finish. kopf still gives tasks of its own up to 5 s to end by
    # themselves (its discovery of the API, started before this run's stop, retries on the closed
    # session), so a stop during that discovery would cost 5 s on every rollout: bound it.
    _exit_soon(1 if memo.get("lost_leadership") else 0, EXIT_GRACE_SECONDS)


def _exit_soon(code: int, after: float) -> None:
    """Ends the process `after` seconds from now unless it has ended by itself before."""

    def hard_exit() -> None:
        logging.shutdown()  # flush the log handlers: os._exit skips them
        os._exit(code)

    timer = threading.Timer(after, hard_exit)
    timer.daemon = True
    timer.start()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def embedding_deployment_changed(
    type: str, name: str, namespace: str | None, body: kopf.Body, memo: Any, **_: Any
) -> None:
    bodies = memo.get("bodies")
    if type == "DELETED":
        metrics.forget(namespace or "", name)
        if isinstance(bodies, Bodies):
            bodies.forget((namespace or "", name))
        shared = ((body.get("spec") or {}).get("gateway") or {}).get("shared")
        if shared and namespace and (queue := _queue(memo)) is not None:
            # Its reconcile finds it gone and takes its model out of the shared gateway.
            queue.trigger((namespace, name), FLEET_CHANGED)
        return
    change = Change.SPEC
    if isinstance(bodies, Bodies):
        change = bodies.put(copy.deepcopy(dict(body)))
    if change is Change.NOTHING:
        return  # the echo of our own status write: that reconcile has seen it
    if change is Change.MEASURED:
        return  # the autoscaler's measurements: no child and no status field of ours follows
    if namespace and (queue := _queue(memo)) is not None:
        priority = FLEET_CHANGED if change is Change.SPEC else CHILD_CHANGED
        queue.trigger((namespace, name), priority)
