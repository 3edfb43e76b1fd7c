"""charts/embedfleet on the real control plane: server-side dry-run, install, and its RBAC runs
the operator.

There is no image registry or kubelet here: the chart's operator pod is a KWOK fake (it turns
Ready but runs nothing). To prove that the operator the chart deploys can do its job with the
identity the chart gives it, the test runs the operator process locally with the environment of
the installed Deployment's container and a kubeconfig holding a token of the chart's
ServiceAccount: every API call then passes the chart's RBAC, and a missing permission shows as a
403 in the operator's log and an EmbeddingDeployment that never reconciles.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedfleet.common.net import free_ports
from embedfleet.testing.cluster import Cluster
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import log_tail, spawn, stop

from .helpers import CHART, REPO_ROOT, VALUES_FULL, by_kind, render

RELEASE = "ef"
EXAMPLE = REPO_ROOT / "examples" / "minilm.yaml"
# No Prometheus Operator CRDs on the test cluster: these kinds cannot be dry-run here.
NO_MONITORING_CRDS = (
    "--set", "serviceMonitor.enabled=false", "--set", "podMonitor.enabled=false",
    "--set", "prometheusRule.enabled=false", "--set", "rbac.serviceMonitors=false",
)  # fmt: skip


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


@pytest.fixture
def namespaces(k8s_cluster: Cluster, k8s_namespace: str) -> Iterator[dict[str, str]]:
    """The release namespace plus an application and a monitoring namespace next to it."""
    extra = {"app": f"{k8s_namespace}-app", "monitoring": f"{k8s_namespace}-mon"}
    for name in extra.values():
        k8s_cluster.create_namespace(name, labels={"embedfleet.dev/test": "true"})
    try:
        yield {"release": k8s_namespace, **extra}
    finally:
        for name in extra.values():
            k8s_cluster.delete_namespace(name)


def server_dry_run(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    manifest = yaml.safe_dump_all(docs)
    proc = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=helm-test", "-f", "-",
        input=manifest, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_rendered_chart_passes_server_side_dry_run(
    k8s_cluster: Cluster, namespaces: dict[str, str]
) -> None:
    ns = namespaces["release"]
    # The CRDs first (for real: later objects are validated against them, and the API server
    # must know embedfleet.dev before a dry-run of RBAC naming it is meaningful).
    k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    defaults = render("--include-crds", namespace=ns)
    server_dry_run(k8s_cluster, defaults)
    full = render(
        "-f", str(VALUES_FULL), *NO_MONITORING_CRDS,
        "--set", f"operator.watchNamespace={namespaces['app']}",
        "--set", f"dashboards.namespace={namespaces['monitoring']}",
        "--set", "priorityClassName=",
        namespace=ns,
    )  # fmt: skip
    assert by_kind(full, "Role")
    server_dry_run(k8s_cluster, full)


def write_token_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig authenticating as the ServiceAccount (a TokenRequest token)."""
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": admin["clusters"][0]["name"], "user": account}}
        ],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def operator_env(
    deployment: dict[str, Any], pod_name: str, ports: dict[str, int]
) -> dict[str, str]:
    """The operator container's environment as the kubelet would resolve it for `pod_name`."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" not in var:
            # The API server drops `value: ""`, leaving the name alone.
            env[var["name"]] = var.get("value", "")
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = {
                "metadata.name": pod_name,
                "metadata.namespace": deployment["metadata"]["namespace"],
                # No pod backs the local process: without a uid its Lease gets no owner (an owner
                # that does not exist would have the garbage collector delete the Lease).
                "metadata.uid": "",
            }[field]
    # Local ports: the pod's fixed container ports may be taken on this machine.
    env["EMBEDFLEET_OPERATOR_METRICS_PORT"] = str(ports["metrics"])
    env["EMBEDFLEET_OPERATOR_HEALTH_PORT"] = str(ports["health"])
    return env


def conditions(emb: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in emb.get("status", {}).get("conditions", [])}


def reconciled(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The EmbeddingDeployment once its current generation reconciled without errors."""
    emb: dict[str, Any] = kubectl_json(cluster, "get", "embeddingdeployment", name, "-n", namespace)
    status = emb.get("status", {})
    if status.get("observedGeneration") != emb["metadata"]["generation"]:
        return None
    # A refused API call leaves Degraded=True (ReconcileFailed): keep waiting, then fail.
    if conditions(emb).get("Degraded", {}).get("status") != "False":
        return None
    return emb


def test_installed_chart_runs_the_operator_with_its_rbac(
    k8s_cluster: Cluster, namespaces: dict[str, str], tmp_path: Path
) -> None:
    ns, app = namespaces["release"], namespaces["app"]
    k8s_cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", ns,
        "--wait", "--timeout", "180s", timeout=240,
    )  # fmt: skip
    status = k8s_cluster.helm("status", RELEASE, "--namespace", ns, "-o", "json")
    assert json.loads(status.stdout)["info"]["status"] == "deployed"
    deployment = kubectl_json(k8s_cluster, "get", "deployment", "-n", ns, "-l",
                              "app.kubernetes.io/component=operator")["items"][0]  # fmt: skip
    assert deployment["status"].get("readyReplicas") == 1  # a KWOK pod, Ready without running
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = write_token_kubeconfig(k8s_cluster, ns, account, tmp_path / "sa.kubeconfig")

    # Least privilege, seen from the API server: things the operator must not be able to do.
    sa = f"system:serviceaccount:{ns}:{account}"
    for verb, resource in [
        ("get", "secrets"),
        ("delete", "namespaces"),
        ("create", "pods"),
        ("create", "clusterroles"),
        ("delete", "customresourcedefinitions"),
    ]:
        proc = k8s_cluster.kubectl("auth", "can-i", verb, resource, "-A", f"--as={sa}", check=False)
        assert proc.stdout.strip() == "no", (verb, resource)  # fmt: skip

    ports = dict(zip(("metrics", "health"), free_ports(2), strict=True))
    env = {**os.environ, **operator_env(deployment, "local-operator", ports)}
    env["KUBECONFIG"] = str(kubeconfig)
    log = tmp_path / "operator.log"
    operator = Path(sys.executable).with_name("embedfleet-operator")
    process, record = spawn("operator", [str(operator)], log, env)
    try:
        k8s_cluster.kubectl("apply", "-n", app, "-f", str(EXAMPLE))
        name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]

        def done() -> dict[str, Any] | None:
            if process.poll() is not None:
                raise AssertionError(f"operator exited: {log_tail(log)}")
            return reconciled(k8s_cluster, app, name)

        try:
            emb = wait_for("the example reconciled", done, timeout=120, interval=1)
        except WaitTimeoutError:
            last = kubectl_json(k8s_cluster, "get", "embeddingdeployment", name, "-n", app)
            raise AssertionError(f"not reconciled: {conditions(last)}\n{log_tail(log)}") from None
        children = kubectl_json(k8s_cluster, "get", "deployments", "-n", app)["items"]
        owned = [d for d in children
                 if any(o["uid"] == emb["metadata"]["uid"]
                        for o in d["metadata"].get("ownerReferences", []))]  # fmt: skip
        assert len(owned) >= 2, [d["metadata"]["name"] for d in children]  # worker + gateway
        lease = kubectl_json(k8s_cluster, "get", "lease", "-n", ns,
                             env["EMBEDFLEET_OPERATOR_LEASE_NAME"])  # fmt: skip
        assert lease["spec"]["holderIdentity"].startswith("local-operator")

        # The `helm test` hook's check, run here against this operator (no kubelet runs the
        # hook pod on KWOK): the chart's Service URL mapped to the local ports.
        (hook,) = by_kind(render(namespace=ns), "Pod")
        script = hook["spec"]["containers"][0]["args"][0]
        script = re.sub(r"http://[^\"]+\.svc", "http://127.0.0.1", script)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for port in container["ports"]:
            script = script.replace(f":{port['containerPort']}/", f":{ports[port['name']]}/")
        check = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=60, check=False)  # fmt: skip
        assert check.returncode == 0, check.stderr
    finally:
        stop([record], [process], grace_seconds=20)
        k8s_cluster.kubectl("delete", "-n", app, "-f", str(EXAMPLE), "--wait=false", check=False)
    text = log.read_text()
    # A bare "403" would match timestamps; the API's refusals read "403 Forbidden" or "forbidden:".
    refusal = re.compile(r"\b403\b.*forbidden|forbidden:", re.IGNORECASE)
    forbidden = [line for line in text.splitlines() if refusal.search(line)]
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])
    k8s_cluster.helm("uninstall", RELEASE, "--namespace", ns, "--wait", timeout=120)
