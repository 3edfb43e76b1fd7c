"""The user's path on a real node, in order: `helm install`, `kubectl apply -f
examples/minilm.yaml`, the unmodified openai client through the gateway Service, disruptions
under steady load, scaling, deletion, `helm uninstall`. Pods run the images `make images` builds;
nothing is faked.

Each test starts from where the previous one left the cluster (pytest runs them in file order);
every wait is bounded and names what it waited for. Figures go to the session's summary.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from .e2efleet import (
    CHART,
    EMB_PATH,
    FIGURES,
    NAME,
    NAMESPACE,
    RELEASE,
    SYSTEM,
    Applied,
    Fleet,
    Report,
    is_ready,
)

TEXTS = [
    "hello",
    "Kubernetes keeps the declared number of replicas running.",
    "A sentence about rivers, mountains and the weather in spring, long enough to need a "
    "few dozen tokens of its own so that pooling sees more than a handful of positions.",
]
MIN_COSINE = 0.999
"""Within 0.1% cosine of sentence-transformers."""
MODEL = "all-MiniLM-L6-v2"


def _cosines(got: list[list[float]], want: np.ndarray) -> list[float]:
    rows = np.asarray(got, dtype=np.float64)
    ref = np.asarray(want, dtype=np.float64)
    dots = (rows * ref).sum(axis=1)
    return list(dots / (np.linalg.norm(rows, axis=1) * np.linalg.norm(ref, axis=1)))


def _lossless(fleet: Fleet, name: str, report: Report) -> None:
    """Records the figure, then: the load ran, and not one request failed."""
    FIGURES[f"{name}: requests sent, lost"] = (len(report.records), len(report.failures))
    assert report.records
    assert not report.failures, f"{report.summary()}\n{fleet.gateway_errors()}"


def _patch(fleet: Fleet, spec: dict[str, Any]) -> None:
    fleet.kubectl("patch", "-n", NAMESPACE, "embeddingdeployment", NAME, "--type=merge",
                  "-p", json.dumps({"spec": spec}))  # fmt: skip


def test_helm_install_runs_the_operator_under_the_charts_rbac(installed: Fleet) -> None:
    fleet = installed
    (pod,) = fleet.pods("operator", SYSTEM)
    assert is_ready(pod), fleet.describe()
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert fleet.forbidden_lines() == []
    lease = fleet.api(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/{RELEASE}")
    assert lease["spec"]["holderIdentity"] == pod["metadata"]["name"]
    # Owned by the holder's pod, so `helm uninstall` leaves no Lease behind.
    owners = lease["metadata"].get("ownerReferences") or []
    assert [o["uid"] for o in owners] == [pod["metadata"]["uid"]], lease["metadata"]

    # A changed pod template rolls the operator: the old pod must hand the Lease over.
    started = time.monotonic()
    fleet.node.cluster.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", SYSTEM, "--reuse-values",
        "--set", "operator.resyncSeconds=30", "--wait", "--timeout", "120s", timeout=140,
    )  # fmt: skip

    def new_leader() -> str | None:
        pods = [p for p in fleet.pods("operator", SYSTEM) if is_ready(p)]
        lease = fleet.api(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/{RELEASE}")
        holder = lease["spec"].get("holderIdentity")
        names = [p["metadata"]["name"] for p in pods]
        return holder if names == [holder] and holder != pod["metadata"]["name"] else None

    fleet.wait("the upgraded operator pod to hold the Lease", new_leader, timeout=60)
    FIGURES["helm upgrade: operator rolled and leading (s)"] = round(time.monotonic() - started, 1)


def test_available_only_once_real_worker_pods_passed_readiness(applied: Applied) -> None:
    fleet = applied.fleet
    for sample in applied.samples:
        if sample["available"]:
            assert sample["workers"] >= 1, applied.samples
            assert sample["gateways"] >= 1, applied.samples
    assert not applied.samples[0]["available"], "Available before any pod could have started"
    workers = fleet.pods("worker")
    assert len(workers) == 2
    for pod in workers:
        name = pod["metadata"]["name"]
        log = fleet.logs(NAMESPACE, name)
        # Readiness came from the worker itself: weights loaded, warmed up, self-checked.
        for line in ("engine loaded", "warm-up done", "self-check passed", "serving"):
            assert line in log, f"{name} never logged {line!r}:\n{log[-3000:]}"
    # The restricted security context holds in the running containers.
    name = fleet.pods("worker")[0]["metadata"]["name"]
    probe = "import os; print(os.getuid(), os.getgid(), os.statvfs('/').f_flag & os.ST_RDONLY)"
    out = fleet.kubectl("exec", "-n", NAMESPACE, name, "--", "python3", "-c", probe)
    assert out.split() == ["65532", "65532", "1"], out  # uid, gid, read-only /
    # The gateway image has no shell to exec: its process, seen from the node, says the same.
    pid = _host_pid(fleet.pods("gateway")[0], "embedfleet-gate")
    status = Path(f"/proc/{pid}/status").read_text()
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines()}
    assert (ids["Uid"][0], ids["Gid"][0]) == ("65532", "65532")
    (root,) = [m for m in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
               if m.split()[4] == "/"]  # fmt: skip
    assert "ro" in root.split()[5].split(","), root


def _host_pid(pod: dict[str, Any], comm: str) -> int:
    """The node's pid of the pod's process named `comm` (the kernel keeps 15 characters), found by
    the pod's uid in its cgroup path."""
    uid = pod["metadata"]["uid"]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup, name = (entry / "cgroup").read_text(), (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name == comm and (uid in cgroup or uid.replace("-", "_") in cgroup):
            return int(entry.name)
    raise AssertionError(f"no process {comm!r} of pod {pod['metadata']['name']} on the node")


def test_printer_columns_show_the_fleet(applied: Applied) -> None:
    fleet = applied.fleet
    out = fleet.kubectl("get", "-n", NAMESPACE, "embeddingdeployment", NAME, "-o", "wide")
    header, row = out.rstrip("\n").splitlines()
    # Cells start where their headers do (kubectl aligns them); an empty cell is blank there.
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    columns = {
        header[a:b].strip(): row[a:b].strip()
        for a, b in zip(starts, [*starts[1:], None], strict=True)
    }
    ready = sum(is_ready(p) for p in fleet.pods("worker"))
    assert columns["NAME"] == NAME
    assert columns["MODEL"] == "file:///opt/embedfleet/models/all-MiniLM-L6-v2"
    assert columns["READY"] == str(ready) == "2"
    assert columns["DESIRED"] == "2"
    assert columns["AVAILABLE"] == "True"
    FIGURES["kubectl get emb -o wide"] = " | ".join(f"{k}={v}" for k, v in columns.items())


def test_openai_client_through_kubectl_port_forward(applied: Applied, reference: Any) -> None:
    import openai

    fleet = applied.fleet
    cluster = fleet.node.cluster
    argv = [str(cluster.tools.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}"]
    argv += ["port-forward", "-n", NAMESPACE, f"svc/{NAME}", ":80"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, line
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{match.group(1)}/v1", api_key="x")
        reply = client.embeddings.create(model=MODEL, input=TEXTS)
        assert [m.id for m in client.models.list()] == [MODEL]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got = [item.embedding for item in reply.data]
    assert min(_cosines(got, reference.encode(TEXTS))) >= MIN_COSINE


def test_openai_client_in_cluster_through_the_service_address(
    applied: Applied, reference: Any
) -> None:
    fleet = applied.fleet
    got = fleet.embed_in_node(f"http://{fleet.cluster_ip()}/v1", TEXTS)
    assert min(_cosines(got, reference.encode(TEXTS))) >= MIN_COSINE


def test_deleting_a_worker_pod_loses_no_request(applied: Applied) -> None:
    fleet = applied.fleet
    fleet.wait_settled(2, timeout=120)
    with fleet.load("worker-delete") as load:
        load.wait_running(4)
        victim = fleet.ready_pods("worker")[0]
        assert fleet.embed_ok(victim) > 0, "the load never reached the worker about to be deleted"
        started = time.monotonic()
        fleet.kubectl("delete", "pod", "-n", NAMESPACE, victim["metadata"]["name"], "--wait=false")
        gone = victim["metadata"]["uid"]
        fleet.wait(
            "the deleted worker gone and its replacement ready",
            lambda: (
                all(p["metadata"]["uid"] != gone for p in fleet.pods("worker"))
                and len(fleet.ready_pods("worker")) == 2
            ),
            timeout=240,
        )
        FIGURES["worker pod deleted: replaced and ready (s)"] = round(time.monotonic() - started, 1)
        load.wait_running(3)
    _lossless(fleet, "worker pod deleted", load.finish())


def test_a_rolling_update_loses_no_request(applied: Applied) -> None:
    fleet = applied.fleet
    before = {p["metadata"]["uid"] for p in fleet.pods("worker")}
    with fleet.load("rolling-update") as load:
        load.wait_running(4)
        started = time.monotonic()
        _patch(fleet, {"worker": {"engine": {"maxBatchTokens": 8192}}})
        fleet.wait(
            "the workers rolled to the new spec",
            lambda: (
                not before & {p["metadata"]["uid"] for p in fleet.pods("worker")}
                and len(fleet.ready_pods("worker")) == 2
            ),
            timeout=360,
        )
        fleet.wait_settled(2, timeout=60)
        FIGURES["rolling update of 2 workers (s)"] = round(time.monotonic() - started, 1)
        load.wait_running(3)
    _lossless(fleet, "rolling update", load.finish())
    config = fleet.api(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-config")
    assert config["data"]["EMBEDFLEET_WORKER_MAX_BATCH_TOKENS"] == "8192"


def test_scaling_to_three_sends_traffic_to_the_new_worker(applied: Applied) -> None:
    fleet = applied.fleet
    before = {p["metadata"]["uid"] for p in fleet.pods("worker")}
    with fleet.load("scale") as load:
        load.wait_running(3)
        fleet.kubectl("scale", "-n", NAMESPACE, f"embeddingdeployment/{NAME}", "--replicas=3")

        def new_ready() -> dict[str, Any] | None:
            fresh = [p for p in fleet.ready_pods("worker") if p["metadata"]["uid"] not in before]
            return fresh[0] if fresh else None

        pod = fleet.wait("the third worker ready", new_ready, timeout=240)
        ready_at = time.monotonic()
        fleet.wait("the third worker's first request", lambda: fleet.embed_ok(pod) > 0, timeout=30)
        seconds = round(time.monotonic() - ready_at, 2)
        FIGURES["scaled to 3: Ready to first request on the new worker (s)"] = seconds
        load.wait_running(2)
    _lossless(fleet, "scale to 3", load.finish())
    assert seconds < 5
    status = fleet.emb()["status"]
    assert (status["readyReplicas"], status["desiredReplicas"]) == (3, 3)


def test_a_killed_gateway_pod_fails_only_what_it_held(applied: Applied) -> None:
    fleet = applied.fleet
    _patch(fleet, {"gateway": {"replicas": 2}})
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"

    def ready_addresses() -> set[str]:
        found = fleet.api(slices, labelSelector=f"kubernetes.io/service-name={NAME}")
        return {
            address
            for s in found["items"]
            for e in s.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready")
            for address in e["addresses"]
        }

    fleet.wait("two ready gateway endpoints", lambda: len(ready_addresses()) == 2, timeout=120)
    with fleet.load("gateway-kill", streams=4) as load:
        load.wait_running(4)
        victim = fleet.ready_pods("gateway")[0]
        container = victim["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        killed = time.monotonic()
        fleet.node.ctr("tasks", "kill", "--signal", "SIGKILL", container)
        ip = victim["status"]["podIP"]
        fleet.wait("the killed gateway out of the Service", lambda: ip not in ready_addresses(),
                   timeout=30)  # fmt: skip
        removed = time.monotonic()
        load.wait_running(5)
        fleet.wait("the killed gateway restarted and back", lambda: len(ready_addresses()) == 2,
                   timeout=120)  # fmt: skip
        back = time.monotonic()
        load.wait_running(3)
    report = load.finish()
    failed = report.failures
    held = [r for r in failed if r["start"] < killed]
    FIGURES["gateway SIGKILL: requests sent, failed (in flight at the kill, sent after)"] = (
        len(report.records),
        len(failed),
        len(held),
        len(failed) - len(held),
    )
    FIGURES["gateway SIGKILL: out of the Service after (s), back after (s)"] = (
        round(removed - killed, 2),
        round(back - killed, 2),
    )
    # The other gateway served throughout: a request in flight at some time between the kill
    # and the endpoint's removal was answered (one on the killed pod would have failed; on a busy
    # machine requests can outlast the window, so none need start inside it). Once the endpoint
    # was gone (plus kube-proxy's sync) nothing failed: only what the killed pod held or was sent
    # before it left.
    assert [
        r for r in report.records if r["start"] < removed and r["end"] > killed and not r["error"]
    ]
    late = [r for r in failed if r["start"] >= removed + 1]
    assert not late, report.summary()
    assert fleet.forbidden_lines() == []


def test_a_gateway_rollout_loses_no_request(applied: Applied, reference: Any) -> None:
    """A gateway setting changed under load rolls the gateway pods: the new ones start from the
    operator's env, find the workers from inside the pod (its service account's token and CA,
    the EndpointSlices its Role allows) and answer as the old ones did, losing no request."""
    fleet = applied.fleet
    pods = fleet.pods("gateway")
    assert len(pods) == 2  # left by the gateway-kill test
    before = {p["metadata"]["uid"] for p in pods}

    def rolled() -> bool:
        pods = fleet.pods("gateway")
        return (
            not before & {p["metadata"]["uid"] for p in pods}
            and len(pods) == 2
            and all(is_ready(p) for p in pods)
        )

    with fleet.load("gateway-rollout", streams=3) as load:
        load.wait_running(4)
        started = time.monotonic()
        _patch(fleet, {"gateway": {"maxClientBatch": 1024}})
        fleet.wait("the gateways rolled", rolled, timeout=240)
        FIGURES["gateway rollout, 2 pods (s)"] = round(time.monotonic() - started, 1)
        load.wait_running(4)
    _lossless(fleet, "gateway rollout", load.finish())
    pods = fleet.pods("gateway")
    # kube-proxy picks a backend per connection and the load's clients keep theirs alive, so
    # the three streams may all have settled on one new pod during the roll and stayed there:
    # the load must have reached the new gateways, not necessarily each of them.
    assert sum(_answered(pod) for pod in pods) > 0, "the load never reached the new gateways"
    reference_vectors = reference.encode(TEXTS)
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["embedfleet-gateway"]
        log = fleet.logs(NAMESPACE, pod["metadata"]["name"])
        assert "embedfleet-gateway listening on http://0.0.0.0:8080" in log, log[-2000:]
        workers = {p["status"]["podIP"] for p in fleet.ready_pods("worker")}
        assert any(ip in log for ip in workers), log[-2000:]  # discovered in-cluster
        answered = _answered(pod)
        got = fleet.embed_in_node(f"http://{pod['status']['podIP']}:8080/v1", TEXTS)
        assert min(_cosines(got, reference_vectors)) >= MIN_COSINE
        assert _answered(pod) > answered, "the pod's metrics missed its answer"
    got = fleet.embed_in_node(f"http://{fleet.cluster_ip()}/v1", TEXTS)
    assert min(_cosines(got, reference_vectors)) >= MIN_COSINE
    assert fleet.forbidden_lines() == []


def _logged(log: str, msg: str, **fields: object) -> bool:
    """Whether a JSON line of `log` has the message `msg` and the given field values."""
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("msg") == msg
            and all(record.get(k) == v for k, v in fields.items())
        ):
            return True
    return False


def _answered(pod: dict[str, Any]) -> float:
    """/v1/embeddings requests a gateway pod answered 200, from its /metrics."""
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        metrics = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("embedfleet_gateway_requests_total{")
        and 'code="200"' in line
        and 'route="/v1/embeddings"' in line
    )


def test_deleting_the_fleet_removes_everything(applied: Applied) -> None:
    fleet = applied.fleet
    started = time.monotonic()
    fleet.kubectl("delete", "-n", NAMESPACE, "embeddingdeployment", NAME, timeout=120)
    kinds = {
        "/api/v1": ("configmaps", "services", "serviceaccounts", "pods"),
        "/apis/apps/v1": ("deployments", "replicasets"),
        "/apis/rbac.authorization.k8s.io/v1": ("roles", "rolebindings"),
        "/apis/policy/v1": ("poddisruptionbudgets",),
    }

    def left() -> list[str]:
        found = []
        for root, plurals in kinds.items():
            for plural in plurals:
                items = fleet.api(
                    f"{root}/namespaces/{NAMESPACE}/{plural}",
                    labelSelector=f"app.kubernetes.io/instance={NAME}",
                )["items"]
                found += [f"{plural}/{i['metadata']['name']}" for i in items]
        slices = fleet.api(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices")
        for s in slices["items"]:
            if s["metadata"]["labels"].get("kubernetes.io/service-name") in (
                NAME,
                f"{NAME}-worker",
            ):
                found.append(f"endpointslices/{s['metadata']['name']}")
        return found

    try:
        fleet.wait("every child of minilm gone", lambda: not left(), timeout=120)
    except TimeoutError as err:
        raise AssertionError(f"{err}: {left()}") from err
    assert fleet.api_or_none(f"{EMB_PATH}/{NAME}") is None
    FIGURES["kubectl delete emb: everything gone (s)"] = round(time.monotonic() - started, 1)


def test_helm_uninstall_leaves_no_operator_objects(installed: Fleet) -> None:
    fleet = installed
    assert fleet.forbidden_lines() == []
    (pod,) = fleet.pods("operator", SYSTEM)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    started = time.monotonic()
    fleet.node.cluster.helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait",
                            "--timeout", "120s", timeout=140)  # fmt: skip
    namespaced = {
        "/api/v1": ("pods", "services", "configmaps", "serviceaccounts"),
        "/apis/apps/v1": ("deployments", "replicasets"),
        "/apis/rbac.authorization.k8s.io/v1": ("roles", "rolebindings"),
        "/apis/coordination.k8s.io/v1": ("leases",),
    }
    # What every namespace has whatever is installed.
    expected = {"configmaps/kube-root-ca.crt", "serviceaccounts/default"}

    def left() -> list[str]:
        found = []
        for root, plurals in namespaced.items():
            for plural in plurals:
                items = fleet.api(f"{root}/namespaces/{SYSTEM}/{plural}")["items"]
                found += [f"{plural}/{i['metadata']['name']}" for i in items]
        for plural in ("clusterroles", "clusterrolebindings"):
            items = fleet.api(f"/apis/rbac.authorization.k8s.io/v1/{plural}")["items"]
            found += [
                f"{plural}/{i['metadata']['name']}"
                for i in items
                if i["metadata"]["name"].startswith(RELEASE)
            ]
        return sorted(set(found) - expected)

    try:
        fleet.wait("no operator object left", lambda: not left(), timeout=90)
    except TimeoutError as err:
        raise AssertionError(f"{err}: {left()}") from err
    FIGURES["helm uninstall: nothing left (s)"] = round(time.monotonic() - started, 1)
    # Helm never deletes a chart's crds/ (README.md: CRDs are upgraded and removed by hand).
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert fleet.api_or_none(f"{crds}/embeddingdeployments.embedfleet.dev") is not None
