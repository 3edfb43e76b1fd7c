"""charts/embedfleet without a cluster: lint, render, values docs and schema, RBAC, security."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedfleet.common.logs import LOG_FORMATS

from .helpers import CHART, REPO_ROOT, VALUES_FULL, by_kind, helm, leaf_paths, render

RULES = CHART / "alerts" / "embedfleet.rules.yaml"
VARIANTS = {"defaults": (), "full": ("-f", str(VALUES_FULL))}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(*VARIANTS[request.param])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_is_clean(variant: str) -> None:
    proc = helm("lint", "--strict", str(CHART), *VARIANTS[variant])
    output = proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in output
    assert "[WARNING]" not in output, output
    assert "[ERROR]" not in output, output


def test_defaults_render_the_operator(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    variant, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "Service", "ConfigMap", "Pod"} <= kinds
    if variant == "full":
        assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Role"} <= kinds
    # Every object carries the chart's labels (kubectl/helm selectors rely on them).
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "embedfleet", doc["metadata"]["name"]


def test_full_values_reach_the_deployment() -> None:
    (deployment,) = by_kind(render("-f", str(VALUES_FULL)), "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert container["image"].endswith("@sha256:" + "0" * 64)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EMBEDFLEET_OPERATOR_NAMESPACE"] == "team-a"
    assert env["EMBEDFLEET_OPERATOR_LEASE_NAME"] == "embedfleet-leader"
    assert env["EMBEDFLEET_OPERATOR_METRICS_PORT"] == "9091"
    assert env["EMBEDFLEET_OPERATOR_RECONCILE_WORKERS"] == "8"
    assert env["EMBEDFLEET_OPERATOR_AUTOSCALER_STATUS_SECONDS"] == "15"
    assert env["EMBEDFLEET_OPERATOR_WATCH_SERVER_TIMEOUT"] == "120"
    assert env["EMBEDFLEET_OPERATOR_LOG_FORMAT"] == "text"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["tolerations"][0]["key"] == "dedicated"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8091, "metrics": 9091}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pods_are_restricted(variant: str) -> None:
    docs = render(*VARIANTS[variant])
    pods = [d["spec"]["template"]["spec"] for d in by_kind(docs, "Deployment")]
    pods += [d["spec"] for d in by_kind(docs, "Pod")]
    assert len(pods) == 2
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert not sc.get("privileged")
            assert "memory" in container["resources"]["limits"]


def test_operator_has_probes_and_a_writable_tmp() -> None:
    (deployment,) = by_kind(render(), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_rbac_has_no_wildcards(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    roles = by_kind(docs, "Role") + by_kind(docs, "ClusterRole")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            # Write access to everything of a kind is never needed by the operator.
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_watch_namespace_scopes_rbac_to_a_role() -> None:
    cluster_wide = render()
    names = {r["metadata"]["name"] for r in by_kind(cluster_wide, "ClusterRole")}
    assert names == {"ef-test-embedfleet", "ef-test-embedfleet-discovery"}
    scoped = render("--set", "operator.watchNamespace=team-a")
    cluster_roles = by_kind(scoped, "ClusterRole")
    # Only the discovery reads stay cluster-wide; managing EmbeddingDeployments is namespaced.
    assert [r["metadata"]["name"] for r in cluster_roles] == ["ef-test-embedfleet-discovery"]
    for rule in cluster_roles[0]["rules"]:
        assert set(rule["verbs"]) == {"list", "watch"}
    role = next(r for r in by_kind(scoped, "Role") if r["metadata"]["name"] == "ef-test-embedfleet")
    assert role["metadata"]["namespace"] == "team-a"


def test_values_are_all_documented() -> None:
    """Every key in values.yaml has a comment right above it that starts with the key's name."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent, key = match.groups()
        above = lines[i - 1] if i else ""
        # A multi-line comment: walk up to its first line.
        j = i - 1
        while (
            j > 0 and lines[j - 1].startswith(f"{indent}# ") and lines[j].startswith(indent + "#")
        ):
            j -= 1
        first = lines[j] if j >= 0 else ""
        if not above.strip().startswith("#") or not re.match(rf"# {key}\b", first.strip()):
            undocumented.append(f"line {i + 1}: {key}")
    assert not undocumented, undocumented


def test_values_full_sets_every_value() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    full = yaml.safe_load(VALUES_FULL.read_text())
    set_paths = set(leaf_paths(full))
    missing = [
        path
        for path in leaf_paths(defaults)
        if path not in set_paths and not any(p.startswith(path + ".") for p in set_paths)
    ]
    assert not missing, f"tests/chart/values-full.yaml does not set {missing}"


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ("replicaCount=-1", "replicaCount"),
        ("podSecurityContext.runAsNonRoot=false", "runAsNonRoot"),
        ("securityContext.allowPrivilegeEscalation=true", "allowPrivilegeEscalation"),
        ("operator.logLevel=verbose", "logLevel"),
        ("operator.metricsPort=70000", "metricsPort"),
        ("operator.reconcileWorkers=0", "reconcileWorkers"),
        ("operator.autoscalerStatusSeconds=-1", "autoscalerStatusSeconds"),
        ("operator.watchNamespace=Not_A_Namespace", "watchNamespace"),
        ("image.digest=latest", "digest"),
        ("nosuchvalue=1", "nosuchvalue"),
    ],
)
def test_schema_rejects_bad_values(override: str, complaint: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", override, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr, proc.stderr
    assert complaint in proc.stderr, proc.stderr


def test_schema_forbids_replicas_without_leader_election() -> None:
    args = ("--set", "replicaCount=2", "--set", "operator.leaderElection.enabled=false")
    proc = helm("template", "x", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr, proc.stderr


def test_schema_is_valid_json_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"].startswith("http://json-schema.org/draft-07")
    assert set(schema["properties"]) == set(yaml.safe_load((CHART / "values.yaml").read_text()))
    # The chart offers the operator's own --log-format choices.
    log_format = schema["properties"]["operator"]["properties"]["logFormat"]
    assert tuple(log_format["enum"]) == LOG_FORMATS


def test_chart_crds_match_the_source() -> None:
    source = sorted(p.name for p in (REPO_ROOT / "crds").glob("*.yaml"))
    assert source, "crds/ is empty"
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == source
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "sync-chart-crds.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_prometheus_rule_is_the_tested_rules_file() -> None:
    (rule,) = by_kind(render("-f", str(VALUES_FULL)), "PrometheusRule")
    source = yaml.safe_load(RULES.read_text())["groups"]
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in source]
    for got, want in zip(groups, source, strict=True):
        for got_rule, want_rule in zip(got["rules"], want["rules"], strict=True):
            if "alert" in want_rule:
                # values-full adds team=search to every alert; nothing else may change.
                assert got_rule["labels"] == {**want_rule["labels"], "team": "search"}
            unlabelled = {k: v for k, v in got_rule.items() if k != "labels"}
            assert unlabelled == {k: v for k, v in want_rule.items() if k != "labels"}


def test_dashboard_configmaps_carry_the_generated_json(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    variant, docs = rendered
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    generated = sorted((REPO_ROOT / "dashboards").glob("embedfleet-*.json"))
    assert len(maps) == len(generated) == 4
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        assert text == (REPO_ROOT / "dashboards" / name).read_text().rstrip("\n")
        json.loads(text)
        if variant == "full":
            assert cm["metadata"]["namespace"] == "monitoring"
            assert cm["metadata"]["annotations"]["grafana_folder"] == "embedfleet"


def test_notes_mention_crd_upgrades() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "never upgrades" in notes
    assert Path(CHART / "README.md").is_file()
