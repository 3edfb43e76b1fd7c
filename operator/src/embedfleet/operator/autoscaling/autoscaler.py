"""The autoscaler's I/O shell: every few seconds, measure each autoscaled fleet, decide, record.

`run` is one of the tasks the operator's startup handler starts once it holds the leader lease
(handlers.py), on the operator's Kubernetes client; the cleanup handler cancels it. A task rather
than a kopf timer, because a timer would put a finalizer on every EmbeddingDeployment.

Per EmbeddingDeployment with autoscaling.enabled and not external, one tick:
1. reads the worker Deployment (replicas asked for and ready),
2. measures the fleet: scrapes the worker and gateway pods' /metrics (or queries Prometheus),
3. runs the pure policy on the state kept in status.autoscaling.policyState,
4. merges the decision into status.autoscaling; the operator's reconcile (triggered by that status
   change) sets the worker Deployment's replicas from status.autoscaling.desiredReplicas,
5. posts an Event when the replica count or the reason changes.

Between two ticks, the fleets the last tick left at zero workers are polled for held requests and
decided for at once when a gateway holds one (wake.py): a request does not wait for the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from prometheus_client import Counter

from embedfleet.operator import paths
from embedfleet.operator.autoscaling import signals, wake
from embedfleet.operator.autoscaling.policy import Observation, Reason, decide
from embedfleet.operator.autoscaling.state import rfc3339, state_from_status, status_patch
from embedfleet.operator.kube import Kube, KubeError
from embedfleet.operator.manifests import MANAGER, METRICS_PORTS, Names
from embedfleet.operator.replicas import autoscaler_desired
from embedfleet.operator.spec import GROUP, VERSION, Spec, SpecError, parse_spec

log = logging.getLogger(__name__)

#: Seconds between two decisions for one fleet (and between two scrapes of each pod).
INTERVAL_SECONDS = 5.0
#: PromQL range for rates in Prometheus mode: at least two scrapes of a 15 s scrape interval.
PROMETHEUS_WINDOW = "1m"
#: Fleets measured at once: a tick of a thousand fleets must not wait for each in turn, nor
#: open a thousand scrapes (or Prometheus queries) at once.
CONCURRENT_FLEETS = 16
#: Bound on one fleet's whole measurement and decision: a hung pod or Prometheus costs that
#: fleet this tick, never the tick of every other fleet.
FLEET_TIMEOUT_SECONDS = 10.0

SCALE_DECISIONS = Counter(
    "embedfleet_operator_scale_decisions_total",
    "Autoscaler decisions that changed the worker replica count, by reason.",
    ["namespace", "deployment", "reason"],
)


async def run(kube: Kube, namespace: str) -> None:
    """Ticks until cancelled; `namespace` empty means every namespace."""
    scraper = signals.Scraper()
    async with aiohttp.ClientSession() as session:
        while True:
            started = time.monotonic()
            sleeping: list[wake.Sleeping] = []
            try:
                sleeping = await tick(kube, session, scraper, namespace)
            except asyncio.CancelledError:
                raise
            except Exception:  # an I/O shell: log and try again next interval
                log.exception("autoscaler tick failed")
            await until_next_tick(kube, session, scraper, sleeping, started + INTERVAL_SECONDS)


async def until_next_tick(
    kube: Kube,
    session: aiohttp.ClientSession,
    scraper: signals.Scraper,
    sleeping: list[wake.Sleeping],
    deadline: float,
) -> None:
    """Sleeps until `deadline` (monotonic), polling the fleets at zero meanwhile; one whose
    gateway holds a request is decided for at once (and polled no more until the next tick)."""
    slots = asyncio.Semaphore(wake.CONCURRENT_POLLS)
    while sleeping and time.monotonic() < deadline:
        polls = [_poll(session, slots, fleet) for fleet in sleeping]
        woken = [f for f, held in zip(sleeping, await asyncio.gather(*polls), strict=True) if held]
        for fleet in woken:
            sleeping.remove(fleet)
            try:
                await _wake(kube, session, scraper, fleet)
            except (KubeError, aiohttp.ClientError, ValueError, TimeoutError) as err:
                log.warning("waking %s/%s failed: %s", fleet.namespace, fleet.name, err)
            except Exception:  # an I/O shell: the next tick decides for it anyway
                log.exception("waking %s/%s failed", fleet.namespace, fleet.name)
        await asyncio.sleep(max(0.0, min(wake.POLL_SECONDS, deadline - time.monotonic())))
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


async def _poll(
    session: aiohttp.ClientSession, slots: asyncio.Semaphore, fleet: wake.Sleeping
) -> bool:
    """Whether a gateway of `fleet` holds a request; an unreachable one says nothing."""

    async def text(url: str) -> str:
        async with slots:
            try:
                timeout = aiohttp.ClientTimeout(total=wake.POLL_TIMEOUT_SECONDS)
                async with session.get(url, timeout=timeout) as response:
                    return await response.text() if response.status == 200 else ""
            except (aiohttp.ClientError, TimeoutError):
                return ""

    texts = await asyncio.gather(*(text(url) for url in fleet.gateway_urls))
    try:
        return wake.demand_waiting(texts)
    except ValueError:  # not an exposition (not our gateway)
        return False


async def _wake(
    kube: Kube, session: aiohttp.ClientSession, scraper: signals.Scraper, fleet: wake.Sleeping
) -> None:
    """One decision for `fleet` now, on its current object (the tick's copy predates its write)."""
    path = paths.embedding_deployment(fleet.namespace, fleet.name)
    body = await kube.call(kube.get_or_none, path)
    if body is None:
        return
    spec = parse_spec(body.get("spec") or {})
    if not spec.autoscaling.operator_driven:
        return  # autoscaling turned off since the tick
    log.info("%s/%s: a gateway holds a request; deciding now", fleet.namespace, fleet.name)
    await asyncio.wait_for(autoscale(kube, session, scraper, body, spec), FLEET_TIMEOUT_SECONDS)


async def tick(
    kube: Kube, session: aiohttp.ClientSession, scraper: signals.Scraper, namespace: str
) -> list[wake.Sleeping]:
    """One decision for every autoscaled fleet; returns those left at zero workers."""
    # resourceVersion=0: served from the API server's watch cache, not a quorum read of etcd.
    found = await kube.call(
        kube.request, "GET", paths.embedding_deployments(namespace), query={"resourceVersion": "0"}
    )
    live = set()
    slots = asyncio.Semaphore(CONCURRENT_FLEETS)
    work = []
    for body in found.get("items", ()):
        meta = body["metadata"]
        key = f"{meta['namespace']}/{meta['name']}/"
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError:
            continue  # the reconciler reports a bad spec; nothing to scale
        if not spec.autoscaling.operator_driven:
            continue
        live.add(key)
        work.append(_bounded(slots, kube, session, scraper, body, spec))
    results = await asyncio.gather(*work)
    for key in {k.rsplit("/", 1)[0] + "/" for k in scraper.rounds} - live:
        scraper.forget(key)
    return [fleet for fleet in results if fleet is not None]


async def _bounded(
    slots: asyncio.Semaphore,
    kube: Kube,
    session: aiohttp.ClientSession,
    scraper: signals.Scraper,
    body: Mapping[str, Any],
    spec: Spec,
) -> wake.Sleeping | None:
    meta = body["metadata"]
    async with slots:
        try:
            return await asyncio.wait_for(
                autoscale(kube, session, scraper, body, spec), FLEET_TIMEOUT_SECONDS
            )
        except TimeoutError:
            log.warning(
                "autoscaling %s/%s took over %.0f s; skipped this tick",
                meta["namespace"], meta["name"], FLEET_TIMEOUT_SECONDS,
            )  # fmt: skip
        except (KubeError, aiohttp.ClientError, ValueError) as err:
            log.warning("autoscaling %s/%s failed: %s", meta["namespace"], meta["name"], err)
        return None


def unchanged(old: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether merging `patch` into status.autoscaling `old` would change nothing (pure)."""
    return all(old.get(key) == value for key, value in patch.items())


async def autoscale(
    kube: Kube,
    session: aiohttp.ClientSession,
    scraper: signals.Scraper,
    body: Mapping[str, Any],
    spec: Spec,
) -> wake.Sleeping | None:
    """Measures, decides and records for one fleet; returns it when it is left at zero workers
    (with its gateways' metrics URLs, to poll for a held request until the next tick)."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    names = Names.of(name)
    worker = await kube.call(
        kube.get_or_none, f"{paths.collection('apps/v1', 'Deployment', namespace)}/{names.worker}"
    )
    if worker is None:
        return None  # not created yet; the reconciler will
    old = (body.get("status") or {}).get("autoscaling") or {}
    # The last decision is the count the fleet is converging to; the Deployment may lag it by
    # one reconcile.
    decided = autoscaler_desired(body.get("status"))
    replicas = (
        decided if decided is not None else int((worker.get("spec") or {}).get("replicas", 1))
    )
    ready = int((worker.get("status") or {}).get("readyReplicas", 0))
    now = time.time()
    if spec.autoscaling.prometheus_url:
        observation = await _from_prometheus(session, spec, namespace, names, ready)
    else:
        key = f"{namespace}/{name}/"
        observation = await _from_pods(kube, session, scraper, key, names, worker, ready, now)

    decision = decide(state_from_status(old), observation, spec.autoscaling, replicas, now)
    patch = status_patch(decision, observation)
    if decision.reason == Reason.NO_METRICS and decided is None:
        # Nothing measured and nothing decided yet: leave the replicas to spec.worker.replicas.
        del patch["desiredReplicas"]
    if not unchanged(old, patch):  # a write per fleet per tick otherwise, at idle too
        await kube.call(
            kube.merge_status, paths.embedding_deployment(namespace, name), {"autoscaling": patch}
        )
    if decision.scaled:
        SCALE_DECISIONS.labels(namespace, name, str(decision.reason)).inc()
    if decision.scaled or old.get("reason") != str(decision.reason):
        log.info("%s/%s: %s: %s", namespace, name, decision.reason, decision.message)
        await kube.call(
            kube.request,
            "POST",
            f"/api/v1/namespaces/{namespace}/events",
            event(body, str(decision.reason), decision.message, now),
        )
    desired = patch.get("desiredReplicas", decided)
    if not wake.at_zero(spec.autoscaling, desired if isinstance(desired, int) else None):
        return None
    return wake.Sleeping(namespace, name, tuple(await _gateway_urls(kube, namespace, names)))


async def _gateway_urls(kube: Kube, namespace: str, names: Names) -> list[str]:
    gateway = await kube.call(
        kube.get_or_none,
        f"{paths.collection('apps/v1', 'Deployment', namespace)}/{names.gateway}",
    )
    return metrics_urls("gateway", await _pods(kube, namespace, gateway)) if gateway else []


def event(
    body: Mapping[str, Any], reason: str, message: str, now: float, type: str = "Normal"
) -> dict[str, Any]:
    """A core/v1 Event about the EmbeddingDeployment (`type` Normal or Warning); the reconciler's
    Events too (handlers.py).

    Posted directly: kopf's own posting needs context its handlers have and this task lacks, and
    kopf.info obeys settings.posting.level, which is meant for handler log lines.
    """
    meta = body["metadata"]
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body.get("apiVersion", f"{GROUP}/{VERSION}"),
            "kind": body.get("kind", "EmbeddingDeployment"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": type,
        "reason": reason,
        "message": message[:1000],
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def _from_pods(
    kube: Kube,
    session: aiohttp.ClientSession,
    scraper: signals.Scraper,
    key: str,
    names: Names,
    worker: Mapping[str, Any],
    ready: int,
    now: float,
) -> Observation | None:
    namespace = str(worker["metadata"]["namespace"])
    worker_pods = await _pods(kube, namespace, worker)
    workers = await scraper.round(
        session, key + "worker", metrics_urls("worker", worker_pods), gateway=False, now=now
    )
    gateway = await kube.call(
        kube.get_or_none,
        f"{paths.collection('apps/v1', 'Deployment', namespace)}/{names.gateway}",
    )
    gateway_pods = await _pods(kube, namespace, gateway) if gateway else []
    gateways = await scraper.round(
        session, key + "gateway", metrics_urls("gateway", gateway_pods), gateway=True, now=now
    )
    return signals.observe(workers, gateways, ready)


def metrics_urls(component: str, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where to scrape the pods of one component ("worker" or "gateway")."""
    return signals.pod_metrics_urls(pods, *METRICS_PORTS[component])


async def _pods(
    kube: Kube, namespace: str, deployment: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not match:
        return []
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    found = await kube.call(
        kube.request,
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query={"labelSelector": selector},
    )
    return list(found.get("items", ()))


async def _from_prometheus(
    session: aiohttp.ClientSession, spec: Spec, namespace: str, names: Names, ready: int
) -> Observation | None:
    queries = signals.prometheus_queries(
        namespace, f"{names.worker}-.*", f"{names.gateway}-.*", PROMETHEUS_WINDOW
    )
    values = await signals.query_prometheus(session, spec.autoscaling.prometheus_url, queries)
    return signals.observation_from_prometheus(values, ready)
