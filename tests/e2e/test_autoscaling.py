"""The built-in autoscaler on the real node, driven from the host: real worker pods, the real
operator pod's autoscaler scraping the real gateway and workers, load from the unmodified openai
client through the gateway Service.

1. Rising, steady and falling load: the p99 guard adds a worker when the client-side p99 (at the
   gateway) is above the SLO, the token rate adds workers as load rises, and they go back to min
   when it falls; every new worker becomes Ready and takes traffic; no request fails.
2. Scale to zero: with minReplicas 0 the idle fleet goes to zero workers, the gateway stays in its
   Service, holds the first request, and answers it once the worker it woke is Ready; the cold
   start is measured and broken down.

The spec sets short windows (and a small per-replica target) so the test runs in minutes on a
2-core machine; every wait is on a condition and bounded. The timeline and the breakdown go to the
session's figures and to JSON files under the test's work directory (tests/e2e/e2eplot.py draws
docs/autoscaling-timeline.png from the first).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .e2efleet import FIGURES, NAME, NAMESPACE, SYSTEM, Fleet, Load, condition, is_ready

MODEL = "all-MiniLM-L6-v2"
RATE = 3.0
"""Requests a second per load stream: ~36 tokens each (1-4 short texts), ~107 tokens/s a stream."""
TARGET = 130
"""Tokens/s per replica: 1 stream wants 1 worker, 3 streams 2 or more, 6 streams the maximum, 3
(with room for streams slower than RATE on a busy machine)."""
LOAD_REASONS = ("ScaleUpForLoad", "ScaleUpForBurst")
"""Scale-ups for load: a step up in load is a burst first (the panic window), then load."""
SLO_OFF = 600_000
"""An SLO no request misses: the load alone decides."""
SLO_TIGHT = 1
"""An SLO every real request misses (tokenizing, a gRPC hop and a forward pass take longer)."""
BASE: dict[str, Any] = {
    "apiVersion": "embedfleet.dev/v1alpha1",
    "kind": "EmbeddingDeployment",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "model": {
            "source": "file:///opt/embedfleet/models/all-MiniLM-L6-v2",
            "servedModelName": MODEL,
        },
        "worker": {
            "replicas": 1,
            "resources": {
                "requests": {"cpu": "250m", "memory": "768Mi"},
                "limits": {"memory": "2Gi"},
            },
        },
        "gateway": {
            "replicas": 1,
            "resources": {
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"memory": "1Gi"},
            },
        },
        "autoscaling": {
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            # The guard's phase first: only latency can ask for a second worker.
            "targetTokensPerSecond": 1_000_000,
            "p99LatencySLOMilliseconds": SLO_TIGHT,
            "panicWindowSeconds": 10,
            "stableWindowSeconds": 20,
            "scaleDownStabilizationSeconds": 20,
        },
    },
}


def _autoscaling(fleet: Fleet) -> dict[str, Any]:
    return dict((fleet.emb().get("status") or {}).get("autoscaling") or {})


def _patch_autoscaling(fleet: Fleet, **fields: Any) -> None:
    body = json.dumps({"spec": {"autoscaling": fields}})
    fleet.kubectl("patch", "-n", NAMESPACE, "embeddingdeployment", NAME, "--type=merge", "-p", body)


def _events(fleet: Fleet) -> list[dict[str, Any]]:
    found = fleet.api(
        f"/api/v1/namespaces/{NAMESPACE}/events", fieldSelector=f"involvedObject.name={NAME}"
    )
    return sorted(found["items"], key=lambda e: e.get("lastTimestamp") or "")


@dataclass
class Timeline:
    """What the fleet looked like over time, sampled at most once a second while the test waits."""

    fleet: Fleet
    started: float = field(default_factory=time.monotonic)
    rows: list[dict[str, Any]] = field(default_factory=list)
    streams: int = 0
    phase: str = ""
    loads: list[Load] = field(default_factory=list)
    _last: float = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        if now - self._last < 1.0:
            return
        self._last = now
        auto = _autoscaling(self.fleet)
        status = self.fleet.deployment("worker").get("status") or {}
        self.rows.append(
            {
                "t": round(now - self.started, 1),
                "mono": now,
                "phase": self.phase,
                "streams": self.streams,
                "tokens_per_second": auto.get("observedTokensPerSecond"),
                "p99_ms": auto.get("p99LatencyMilliseconds"),
                "desired": auto.get("desiredReplicas"),
                "ready": int(status.get("readyReplicas") or 0),
                "reason": auto.get("reason"),
            }
        )

    def wait(self, what: str, probe: Any, timeout: float) -> Any:
        def sampled() -> Any:
            self.sample()
            return probe()

        try:
            return self.fleet.wait(what, sampled, timeout)
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{self.table()}") from err

    def hold(self, seconds: float) -> None:
        """Keeps sampling for `seconds` with the load as it is (no condition: a steady phase)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for load in self.loads:
                # A stopped load has its report; any other must still be running.
                assert load.report is not None or load.proc.poll() is None, "a load generator died"
            self.sample()
            time.sleep(0.25)

    def start_load(self, stack: ExitStack, streams: int) -> Load:
        name = f"timeline-{len(self.loads)}"
        load = stack.enter_context(self.fleet.load(name, streams=streams, seconds=600, rate=RATE))
        self.loads.append(load)
        self.streams += streams
        return load

    def stop_load(self, load: Load, streams: int) -> None:
        load.finish()
        self.streams -= streams

    def client_p99_ms(self, start: float, end: float) -> float | None:
        """p99 of the latencies the load generators saw for requests started in [start, end)."""
        took = [
            r["end"] - r["start"]
            for load in self.loads
            if load.report is not None
            for r in load.report.between(start, end)
        ]
        return round(float(np.percentile(took, 99)) * 1000, 1) if took else None

    def table(self, every: float = 5.0) -> str:
        """One row per `every` seconds: the figure for the closing note."""
        out = [
            "| t (s) | phase | streams | tokens/s (gateway) | p99 ms (gateway) | p99 ms (client) "
            "| desired | ready | reason |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        next_t = 0.0
        for row in self.rows:
            if row["t"] < next_t:
                continue
            next_t = row["t"] + every
            client = self.client_p99_ms(row["mono"] - every, row["mono"])
            out.append(
                f"| {row['t']:.0f} | {row['phase']} | {row['streams']} | "
                f"{row['tokens_per_second']} | {row['p99_ms']} | {client} | {row['desired']} | "
                f"{row['ready']} | {row['reason']} |"
            )
        return "\n".join(out)

    def dump(self, path: Path) -> None:
        rows = [
            {**r, "client_p99_ms": self.client_p99_ms(r["mono"] - 5.0, r["mono"])}
            for r in self.rows
        ]
        path.write_text(json.dumps({"rows": rows}, indent=1))


@pytest.fixture(scope="module")
def scaling(installed: Fleet) -> Fleet:
    """The test's EmbeddingDeployment, Available with its one worker."""
    fleet = installed
    fleet.kubectl("apply", "-f", "-", input=json.dumps(BASE))

    def available() -> bool:
        cond = condition(fleet.emb(), "Available")
        return bool(cond and cond["status"] == "True")

    try:
        fleet.wait("EmbeddingDeployment minilm Available", available, timeout=420)
    except TimeoutError as err:
        raise AssertionError(f"{err}; {fleet.describe()}") from err
    fleet.wait_settled(1, timeout=120)
    return fleet


def _new_ready_worker(fleet: Fleet, before: set[str]) -> dict[str, Any] | None:
    fresh = [p for p in fleet.ready_pods("worker") if p["metadata"]["uid"] not in before]
    return fresh[0] if fresh else None


def test_rising_steady_and_falling_load(scaling: Fleet) -> None:
    fleet = scaling
    timeline = Timeline(fleet)
    reasons_seen: list[str] = []

    def desired_at_least(n: int, *reasons: str) -> bool:
        auto = _autoscaling(fleet)
        if auto.get("reason"):
            reasons_seen.append(str(auto["reason"]))
        return int(auto.get("desiredReplicas") or 0) >= n and bool(set(reasons) & set(reasons_seen))

    with ExitStack() as stack:
        stack.callback(timeline.dump, fleet.work / "autoscaling-timeline.json")
        # 1. The p99 guard: one stream, a target so high that the load asks for one worker, and
        #    an SLO every request misses. The guard alone adds a worker.
        timeline.phase = "p99 > SLO"
        first = timeline.start_load(stack, 1)
        before = {p["metadata"]["uid"] for p in fleet.pods("worker")}
        timeline.wait("a scale-up for latency", lambda: desired_at_least(2, "ScaleUpForLatency"),
                      timeout=120)  # fmt: skip
        pod = timeline.wait("the latency-added worker Ready",
                            lambda: _new_ready_worker(fleet, before), timeout=240)  # fmt: skip
        timeline.wait("the latency-added worker's first request",
                      lambda: fleet.embed_ok(pod) > 0, timeout=30)  # fmt: skip
        # 2. Back to load-driven sizing: one stream is one worker's worth.
        _patch_autoscaling(fleet, targetTokensPerSecond=TARGET, p99LatencySLOMilliseconds=SLO_OFF)
        timeline.phase = "low"
        timeline.wait("back to one worker at one stream",
                      lambda: _autoscaling(fleet).get("desiredReplicas") == 1
                      and len(fleet.pods("worker")) == 1, timeout=180)  # fmt: skip
        # 3. Rising load.
        timeline.phase = "rising"
        reasons_seen.clear()
        second = timeline.start_load(stack, 2)
        timeline.wait("a scale-up for load at three streams",
                      lambda: desired_at_least(2, *LOAD_REASONS), timeout=120)  # fmt: skip
        before = {p["metadata"]["uid"] for p in fleet.pods("worker")}
        peak = timeline.start_load(stack, 3)
        timeline.wait("the maximum of 3 workers at six streams",
                      lambda: desired_at_least(3, *LOAD_REASONS), timeout=120)  # fmt: skip
        timeline.wait("3 workers Ready", lambda: len(fleet.ready_pods("worker")) == 3,
                      timeout=240)  # fmt: skip
        # 4. Steady: every worker, the new ones included, takes traffic; the count holds.
        timeline.phase = "steady"
        served = {p["metadata"]["uid"]: fleet.embed_ok(p) for p in fleet.ready_pods("worker")}
        steady_from = len(timeline.rows)
        timeline.hold(20)
        for p in fleet.ready_pods("worker"):
            assert fleet.embed_ok(p) > served.get(p["metadata"]["uid"], 0), (
                f"worker {p['metadata']['name']} took no traffic in the steady phase"
            )
        assert before - {p["metadata"]["uid"] for p in fleet.pods("worker")} == set()
        steady = {r["desired"] for r in timeline.rows[steady_from:]}
        assert steady == {3}, f"the count moved under steady load: {steady}\n{timeline.table()}"
        # 5. Falling load, then none: back to min.
        timeline.phase = "falling"
        timeline.stop_load(peak, 3)
        timeline.stop_load(second, 2)
        timeline.wait("back to min (1) as load falls",
                      lambda: _autoscaling(fleet).get("desiredReplicas") == 1
                      and len(fleet.pods("worker")) == 1, timeout=180)  # fmt: skip
        timeline.phase = "idle"
        timeline.stop_load(first, 1)
        timeline.hold(10)
        assert _autoscaling(fleet).get("desiredReplicas") == 1

    timeline.dump(fleet.work / "autoscaling-timeline.json")
    FIGURES["autoscaling timeline (json)"] = str(fleet.work / "autoscaling-timeline.json")
    FIGURES["autoscaling timeline"] = "\n" + timeline.table()
    reasons = [e["reason"] for e in _events(fleet)]
    assert "ScaleUpForLatency" in reasons, reasons
    assert set(LOAD_REASONS) & set(reasons), reasons
    assert "ScaleDownForLoad" in reasons, reasons
    # Workers came and went under load: not one request failed.
    records = [r for load in timeline.loads if load.report for r in load.report.records]
    failed = [r for r in records if r["error"]]
    FIGURES["autoscaling timeline: requests sent, failed"] = (len(records), len(failed))
    assert records
    assert not failed, (failed[:5], fleet.gateway_errors())


def _log_times(fleet: Fleet, pod: str, messages: tuple[str, ...]) -> dict[str, float]:
    """Wall-clock time of the first log line with each message (the JSON logs' `ts`)."""
    found: dict[str, float] = {}
    for line in fleet.logs(NAMESPACE, pod).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("msg") in messages:
            found.setdefault(str(record["msg"]), float(record["ts"]))
    return found


def _operator_woke(fleet: Fleet) -> float | None:
    """When the operator's autoscaler was woken between ticks by a held request (its log)."""
    for pod in fleet.pods("operator", SYSTEM):
        for line in fleet.logs(SYSTEM, pod["metadata"]["name"]).splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "a gateway holds a request" in str(record.get("msg")):
                return float(record["ts"])
    return None


def _gateway_saw(fleet: Fleet, gateway: str, ip: str) -> dict[str, float]:
    """When the gateway added the worker at `ip` from its EndpointSlice, and found it ready."""
    found: dict[str, float] = {}
    for line in fleet.logs(NAMESPACE, gateway).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("msg") == "workers changed" and any(
            a.startswith(f"{ip}:") for a in record.get("added") or ()
        ):
            found.setdefault("added", float(record["ts"]))
        worker = str(record.get("worker", ""))
        if (
            record.get("msg") == "worker readiness"
            and worker.startswith(f"{ip}:")
            and record.get("ready")
        ):
            found.setdefault("ready", float(record["ts"]))
    return found


def test_scale_to_zero_and_back_on_the_first_request(scaling: Fleet, reference: Any) -> None:
    fleet = scaling
    gateway_before = {p["metadata"]["uid"] for p in fleet.pods("gateway")}
    _patch_autoscaling(fleet, minReplicas=0, targetTokensPerSecond=TARGET,
                       p99LatencySLOMilliseconds=SLO_OFF)  # fmt: skip
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"

    def ready_gateway_endpoints() -> int:
        found = fleet.api(slices, labelSelector=f"kubernetes.io/service-name={NAME}")
        return sum(
            1
            for s in found["items"]
            for e in s.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready")
        )

    def at_zero() -> bool:
        gateways = fleet.pods("gateway")
        return (
            _autoscaling(fleet).get("desiredReplicas") == 0
            and not fleet.pods("worker")
            and len(gateways) == 1
            and gateways[0]["metadata"]["uid"] not in gateway_before
            and is_ready(gateways[0])
        )

    idle_from = time.monotonic()
    try:
        fleet.wait("the idle fleet at zero workers", at_zero, timeout=240)
    except TimeoutError as err:
        raise AssertionError(f"{err}: {_autoscaling(fleet)}\n{fleet.describe()}") from err
    FIGURES["minReplicas 0, idle: at zero workers after (s)"] = round(
        time.monotonic() - idle_from, 1
    )
    # Zero workers by design: the gateway stays in its Service (its /ready holds).
    (gateway,) = fleet.pods("gateway")
    assert ready_gateway_endpoints() == 1

    texts = ["hello", "The first request after the fleet went to zero."]
    answer: dict[str, Any] = {}

    def first_request() -> None:
        answer["sent"] = time.time()
        try:
            answer["vectors"] = fleet.embed_in_node(f"http://{fleet.cluster_ip()}/v1", texts)
        except AssertionError as err:
            answer["error"] = str(err)
        answer["answered"] = time.time()

    seen: dict[str, float] = {}
    facts: dict[str, str] = {}
    pod_name: list[str] = []
    thread = threading.Thread(target=first_request)
    thread.start()

    def watch() -> bool:
        now = time.time()
        auto = _autoscaling(fleet)
        if "decided" not in seen and int(auto.get("desiredReplicas") or 0) >= 1:
            seen["decided"] = now
            facts["decision"] = str(auto.get("message"))
        for pod in fleet.pods("worker"):
            if not pod_name:
                pod_name.append(pod["metadata"]["name"])
                seen["pod created"] = now
            if pod["metadata"]["name"] != pod_name[0]:
                continue
            if "scheduled" not in seen and condition(pod, "PodScheduled"):
                seen["scheduled"] = now
            statuses = (pod.get("status") or {}).get("containerStatuses") or ()
            if "running" not in seen and any("running" in (s.get("state") or {}) for s in statuses):
                seen["running"] = now
                facts["ip"] = str(pod["status"].get("podIP"))
            if "pod ready" not in seen and is_ready(pod):
                seen["pod ready"] = now
        return not thread.is_alive()

    fleet.wait("the first request answered", watch, timeout=180)
    thread.join()
    assert "error" not in answer, answer["error"]
    got = np.asarray(answer["vectors"], dtype=np.float64)
    want = np.asarray(reference.encode(texts), dtype=np.float64)
    cosines = (got * want).sum(axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    )
    assert min(cosines) >= 0.999
    # The decision came from the held request (the only demand there was).
    assert "held" in facts["decision"], facts["decision"]

    worker_log = _log_times(
        fleet,
        pod_name[0],
        ("loading weights", "engine loaded", "warm-up done", "self-check passed", "serving"),
    )
    gw = _gateway_saw(fleet, gateway["metadata"]["name"], facts["ip"])
    # The host routes to pod IPs.
    url = f"http://{gateway['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        held = reply.read().decode()
    # The request reached the gateway when its hold began: the hold ends as the gateway finds the
    # worker ready. "request sent" is the client process's start (a fresh Python in the node).
    samples = {s.name: s.value for f in text_string_to_metric_families(held) for s in f.samples
               if not s.labels}  # fmt: skip
    hold = samples["embedfleet_gateway_hold_seconds_sum"]
    woke = _operator_woke(fleet)
    sent = answer["sent"]
    points = [
        ("request sent (client process started)", sent),
        ("gateway holding the request", gw["ready"] - hold),
        *([("operator woken by the held request", woke)] if woke else []),
        ("autoscaler decided 0 -> 1 (status seen)", seen["decided"]),
        ("worker pod created (seen)", seen["pod created"]),
        ("container running (seen)", seen["running"]),
        ("worker loading weights (imports done)", worker_log["loading weights"]),
        ("engine loaded (torch + weights)", worker_log["engine loaded"]),
        ("warm-up done (one probe request)", worker_log["warm-up done"]),
        ("self-check passed", worker_log["self-check passed"]),
        ("serving (gRPC health SERVING)", worker_log["serving"]),
        ("pod Ready (kubelet probe, seen)", seen["pod ready"]),
        ("gateway added the worker (EndpointSlice)", gw["added"]),
        ("gateway found it ready (Info probe)", gw["ready"]),
        ("answer received", answer["answered"]),
    ]
    breakdown = {
        f"{a} -> {b}": round(tb - ta, 2) for (a, ta), (b, tb) in itertools.pairwise(points)
    }
    total = round(answer["answered"] - sent, 2)
    (fleet.work / "cold-start.json").write_text(
        json.dumps({"total_seconds": total, "steps": breakdown, "points": points}, indent=1)
    )
    FIGURES["cold start from zero: first request -> first answer (s)"] = total
    FIGURES["cold start breakdown (s)"] = "\n" + "\n".join(
        f"  {k}: {v}" for k, v in breakdown.items()
    )

    # Capacity (admission's and the autoscaler's yardstick) is still measured: after the worker
    # served, once it idled.
    def measured() -> dict[str, float] | None:
        found = _log_times(fleet, pod_name[0], ("serving", "capacity measured"))
        return found if "capacity measured" in found else None

    after = fleet.wait("the woken worker's capacity measured", measured, timeout=60)
    FIGURES["cold start: serving -> capacity measured in the background (s)"] = round(
        after["capacity measured"] - after["serving"], 2
    )
    # The held request left the gauges; the gateway counted one hold.
    assert samples["embedfleet_gateway_held_requests"] == 0
    assert samples["embedfleet_gateway_hold_seconds_count"] == 1
