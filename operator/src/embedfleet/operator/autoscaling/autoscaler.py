"""The autoscaler's I/O shell: every few seconds, measure each autoscaled fleet, decide, record.

`run` is one of the tasks the operator's startup handler starts once it holds the leader lease
(handlers.py), on the operator's Kubernetes client; the cleanup handler cancels it. A task rather
than a kopf timer, because a timer would put a finalizer on every EmbeddingDeployment.

Per EmbeddingDeployment with autoscaling.enabled and not external, one tick:
1. reads the worker Deployment (replicas asked for and ready) from the operator's informer,
2. measures the fleet: scrapes the worker and gateway pods' /metrics, or reads its series from
   the answers to one set of Prometheus queries for every fleet on that Prometheus,
3. runs the pure policy on the state it remembers (memory.py; from status.autoscaling.policyState
   when it first sees the fleet),
4. hands its writes to the recorder (recorder.py), which merges a new decision into
   status.autoscaling at once and measurements at most every `status_seconds`, off the tick; the
   operator's reconcile (triggered by that status change) sets the worker Deployment's replicas
   from status.autoscaling.desiredReplicas,
5. and an Event when the replica count or the reason changes.

At a thousand fleets a tick costs the API server one list and the writes (the fleets
come from the API server's watch cache, the Deployments from the operator's informer) and
Prometheus eight queries.

Between two ticks, the fleets the last tick left at zero workers are polled for held requests and
decided for at once when a gateway holds one (wake.py): a request does not wait for the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from embedfleet.operator import paths
from embedfleet.operator.autoscaling import signals, wake
from embedfleet.operator.autoscaling.memory import REFRESH_SECONDS, Memory, decision_changed
from embedfleet.operator.autoscaling.policy import Observation, Reason, decide
from embedfleet.operator.autoscaling.recorder import Recorder
from embedfleet.operator.autoscaling.state import rfc3339, status_patch
from embedfleet.operator.informer import Informer
from embedfleet.operator.kube import Kube, KubeError
from embedfleet.operator.manifests import MANAGER, METRICS_PORTS, Names
from embedfleet.operator.metrics import DECISIONS, SCALE_DECISIONS, TICK_SECONDS
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


@dataclass(frozen=True)
class Caches:
    """What the operator already watches: the autoscaler reads Deployments there instead of
    asking the API server for each fleet's every tick. No informer: it asks."""

    informer: Informer | None = None

    async def deployment(self, kube: Kube, namespace: str, name: str) -> Mapping[str, Any] | None:
        informer = self.informer
        if informer is not None and informer.informs("Deployment") and informer.wait_synced(0):
            return informer.get("Deployment", namespace, name)
        return await kube.call(
            kube.get_or_none, f"{paths.collection('apps/v1', 'Deployment', namespace)}/{name}"
        )


@dataclass
class Autoscaler:
    """One operator's autoscaler: its clients, caches and memory of every fleet."""

    kube: Kube
    session: aiohttp.ClientSession
    scraper: signals.Scraper = field(default_factory=signals.Scraper)
    caches: Caches = field(default_factory=Caches)
    memory: Memory = field(default_factory=Memory)
    recorder: Recorder = field(init=False)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.kube, self.memory)


async def run(
    kube: Kube,
    namespace: str,
    caches: Caches | None = None,
    status_seconds: float = REFRESH_SECONDS,
) -> None:
    """Ticks until cancelled; `namespace` empty means every namespace."""
    async with aiohttp.ClientSession() as session:
        scaler = Autoscaler(kube, session, caches=caches or Caches(), memory=Memory(status_seconds))
        try:
            while True:
                started = time.monotonic()
                sleeping: list[wake.Sleeping] = []
                try:
                    sleeping = await tick(scaler, namespace)
                except asyncio.CancelledError:
                    raise
                except Exception:  # an I/O shell: log and try again next interval
                    log.exception("autoscaler tick failed")
                TICK_SECONDS.observe(time.monotonic() - started)
                await until_next_tick(scaler, sleeping, started + INTERVAL_SECONDS)
        finally:
            scaler.recorder.cancel()


async def until_next_tick(
    scaler: Autoscaler, sleeping: list[wake.Sleeping], deadline: float
) -> None:
    """Sleeps until `deadline` (monotonic), polling the fleets at zero meanwhile; one whose
    gateway holds a request is decided for at once (and polled no more until the next tick)."""
    slots = asyncio.Semaphore(wake.CONCURRENT_POLLS)
    while sleeping and time.monotonic() < deadline:
        polls = [_poll(scaler.session, slots, fleet) for fleet in sleeping]
        woken = [f for f, held in zip(sleeping, await asyncio.gather(*polls), strict=True) if held]
        for fleet in woken:
            sleeping.remove(fleet)
            try:
                await _wake(scaler, fleet)
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


async def _wake(scaler: Autoscaler, fleet: wake.Sleeping) -> None:
    """One decision for `fleet` now, on its current object (the tick's copy predates its write)."""
    path = paths.embedding_deployment(fleet.namespace, fleet.name)
    body = await scaler.kube.call(scaler.kube.get_or_none, path)
    if body is None:
        return
    spec = parse_spec(body.get("spec") or {})
    if not spec.autoscaling.operator_driven:
        return  # autoscaling turned off since the tick
    log.info("%s/%s: a gateway holds a request; deciding now", fleet.namespace, fleet.name)
    await asyncio.wait_for(autoscale(scaler, body, spec), FLEET_TIMEOUT_SECONDS)


async def tick(scaler: Autoscaler, namespace: str) -> list[wake.Sleeping]:
    """One decision for every autoscaled fleet; returns those left at zero workers."""
    live: set[tuple[str, str]] = set()
    fleets: list[tuple[dict[str, Any], Spec]] = []
    for body in await _fleets(scaler.kube, namespace):
        meta = body["metadata"]
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError:
            continue  # the reconciler reports a bad spec; nothing to scale
        if not spec.autoscaling.operator_driven:
            continue
        live.add((meta["namespace"], meta["name"]))
        fleets.append((body, spec))
    urls = sorted({s.autoscaling.prometheus_url for _, s in fleets} - {""})
    answers = {url: await _ask(scaler.session, url, namespace) for url in urls}
    slots = asyncio.Semaphore(CONCURRENT_FLEETS)
    work = []
    for body, spec in fleets:
        url = spec.autoscaling.prometheus_url
        if url and answers[url] is None:
            continue  # that Prometheus failed this tick (logged once, not once per fleet)
        work.append(_bounded(slots, scaler, body, spec, answers.get(url)))
    results = await asyncio.gather(*work)
    keys = {f"{ns}/{name}/" for ns, name in live}
    for key in {k.rsplit("/", 1)[0] + "/" for k in scaler.scraper.rounds} - keys:
        scaler.scraper.forget(key)
    scaler.memory.keep_only(live)
    return [fleet for fleet in results if fleet is not None]


async def _fleets(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    # From the API server's watch cache, not a quorum read of etcd. Not the operator's Bodies:
    # a replica that just took the Lease has seen events of changed fleets only.
    found = await kube.call(
        kube.request,
        "GET",
        paths.embedding_deployments(namespace),
        query={"resourceVersion": "0"},
    )
    return list(found.get("items", ()))


async def _ask(session: aiohttp.ClientSession, url: str, namespace: str) -> signals.Answers | None:
    """The signals of every fleet on the Prometheus at `url`; None when it failed."""
    queries = signals.prometheus_queries(PROMETHEUS_WINDOW, namespace)
    try:
        return await asyncio.wait_for(
            signals.query_prometheus(session, url, queries), FLEET_TIMEOUT_SECONDS
        )
    except (aiohttp.ClientError, ValueError, TimeoutError) as err:
        log.warning("querying Prometheus at %s failed: %s", url, err or type(err).__name__)
        return None


async def _bounded(
    slots: asyncio.Semaphore,
    scaler: Autoscaler,
    body: Mapping[str, Any],
    spec: Spec,
    answers: signals.Answers | None,
) -> wake.Sleeping | None:
    meta = body["metadata"]
    async with slots:
        try:
            return await asyncio.wait_for(
                autoscale(scaler, body, spec, answers), FLEET_TIMEOUT_SECONDS
            )
        except TimeoutError:
            log.warning(
                "autoscaling %s/%s took over %.0f s; skipped this tick",
                meta["namespace"], meta["name"], FLEET_TIMEOUT_SECONDS,
            )  # fmt: skip
        except (KubeError, aiohttp.ClientError, ValueError) as err:
            log.warning("autoscaling %s/%s failed: %s", meta["namespace"], meta["name"], err)
        return None


async def autoscale(
    scaler: Autoscaler,
    body: Mapping[str, Any],
    spec: Spec,
    answers: signals.Answers | None = None,
) -> wake.Sleeping | None:
    """Measures, decides and records for one fleet; returns it when it is left at zero workers
    (with its gateways' metrics URLs, to poll for a held request until the next tick). In
    Prometheus mode `answers` are the tick's; without them this fleet's own are asked for."""
    kube, caches = scaler.kube, scaler.caches
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    names = Names.of(name)
    worker = await caches.deployment(kube, namespace, names.worker)
    if worker is None:
        return None  # not created yet; the reconciler will
    now = time.time()
    fleet = scaler.memory.recall(
        (namespace, name),
        str(meta.get("uid", "")),
        (body.get("status") or {}).get("autoscaling") or {},
        now,
    )
    # The last decision is the count the fleet is converging to; the Deployment may lag it by
    # its write and one reconcile.
    decided = fleet.desired
    replicas = (
        decided if decided is not None else int((worker.get("spec") or {}).get("replicas", 1))
    )
    ready = int((worker.get("status") or {}).get("readyReplicas", 0))
    observation: Observation | None
    if url := spec.autoscaling.prometheus_url:
        if answers is None:
            queries = signals.prometheus_queries(PROMETHEUS_WINDOW, namespace, name)
            answers = await signals.query_prometheus(scaler.session, url, queries)
        values = signals.values_of(answers, (namespace, name))
        observation = signals.observation_from_prometheus(values, ready)
    else:
        key = f"{namespace}/{name}/"
        observation = await _from_pods(scaler, key, names, worker, ready, now)

    decision = decide(fleet.state, observation, spec.autoscaling, replicas, now)
    fleet.state = decision.state
    patch = status_patch(decision, observation)
    if decision.reason == Reason.NO_METRICS and decided is None:
        # Nothing measured and nothing decided yet: leave the replicas to spec.worker.replicas.
        del patch["desiredReplicas"]
    due = scaler.memory.due(fleet, patch, now)
    decided_now = decision_changed(fleet.written, patch)
    DECISIONS.inc()
    if decision.scaled:
        SCALE_DECISIONS.labels(namespace, name, str(decision.reason)).inc()
    if decision.scaled or fleet.reason != str(decision.reason):
        log.info("%s/%s: %s: %s", namespace, name, decision.reason, decision.message)
        scaler.recorder.event(namespace, event(body, str(decision.reason), decision.message, now))
    if isinstance(desired := patch.get("desiredReplicas"), int):
        fleet.desired = desired
    fleet.reason = str(decision.reason)
    scaler.recorder.status((namespace, name), fleet, patch if due else None, decided_now, now)
    if not wake.at_zero(spec.autoscaling, fleet.desired):
        return None
    return wake.Sleeping(namespace, name, tuple(await _gateway_urls(scaler, namespace, names)))


async def _gateway_urls(scaler: Autoscaler, namespace: str, names: Names) -> list[str]:
    gateway = await scaler.caches.deployment(scaler.kube, namespace, names.gateway)
    return metrics_urls("gateway", await _pods(scaler.kube, gateway)) if gateway else []


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
    scaler: Autoscaler,
    key: str,
    names: Names,
    worker: Mapping[str, Any],
    ready: int,
    now: float,
) -> Observation | None:
    namespace = str(worker["metadata"]["namespace"])
    session, scraper = scaler.session, scaler.scraper
    worker_pods = await _pods(scaler.kube, worker)
    workers = await scraper.round(
        session, key + "worker", metrics_urls("worker", worker_pods), gateway=False, now=now
    )
    gateway = await scaler.caches.deployment(scaler.kube, namespace, names.gateway)
    gateway_pods = await _pods(scaler.kube, gateway) if gateway else []
    gateways = await scraper.round(
        session, key + "gateway", metrics_urls("gateway", gateway_pods), gateway=True, now=now
    )
    return signals.observe(workers, gateways, ready)


def metrics_urls(component: str, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Where to scrape the pods of one component ("worker" or "gateway")."""
    return signals.pod_metrics_urls(pods, *METRICS_PORTS[component])


async def _pods(kube: Kube, deployment: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not match:
        return []
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    namespace = deployment["metadata"]["namespace"]
    found = await kube.call(
        kube.request,
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        # From the API server's watch cache: a pod a moment old is missed one tick at most.
        query={"labelSelector": selector, "resourceVersion": "0"},
    )
    return list(found.get("items", ()))
