from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from embedfleet.operator.manifests import CONFIG_HASH, LABEL_OWNER, Images, Owner
from embedfleet.operator.render.fleet import children
from embedfleet.operator.render.gateway import gateway_env
from embedfleet.operator.render.workers import worker_env
from embedfleet.operator.spec import parse_spec
from embedfleet.worker.settings import WorkerSettings

from .helpers import EXAMPLES, MINILM_CHILDREN, gateway_settings, load_yaml

OWNER = Owner(name="minilm", namespace="ml", uid="1234-uid")
IMAGES = Images(worker="reg/worker:1", gateway="reg/gateway:1")


def _example(name: str) -> dict[str, Any]:
    return dict(load_yaml(EXAMPLES / name)["spec"])


def _by_key(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objs}


def child_objects(raw: dict[str, Any], replicas: int = 2, monitors: bool = False) -> dict[str, Any]:
    return _by_key(children(OWNER, parse_spec(raw), replicas, IMAGES, monitors))


def test_minilm_children_and_owner_references() -> None:
    objs = child_objects(_example("minilm.yaml"))
    assert set(objs) == MINILM_CHILDREN
    for obj in objs.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["labels"][LABEL_OWNER] == "minilm"
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "embedfleet.dev/v1alpha1",
            "kind": "EmbeddingDeployment",
            "name": "minilm",
            "uid": "1234-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_worker_deployment_shape() -> None:
    dep = child_objects(_example("minilm.yaml"), replicas=3)["Deployment/minilm-worker"]
    spec = dep["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["embedfleet-worker"]
    assert container["image"] == "reg/worker:1"
    assert container["readinessProbe"]["grpc"] == {"port": 50051, "service": ""}
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    assert pod["terminationGracePeriodSeconds"] == 30 + 5 + 10
    assert container["envFrom"] == [{"configMapRef": {"name": "minilm-config"}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "embedfleet",
        "app.kubernetes.io/instance": "minilm",
        "app.kubernetes.io/component": "worker",
    }
    # The selector matches the pod template (the API server refuses it otherwise).
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_gpu_worker_requests_gpus_and_tolerates_their_taint() -> None:
    objs = child_objects(_example("qwen3-embedding-gpu.yaml"))
    pod = objs["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert objs["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_WORKER_DTYPE"] == "bfloat16"


def test_hf_source_downloads_in_an_init_container_into_the_cache_claim() -> None:
    raw = _example("qwen3-embedding-gpu.yaml")
    for kind in ("worker", "gateway"):
        pod = child_objects(raw)[f"Deployment/minilm-{kind}"]["spec"]["template"]["spec"]
        (fetch,) = pod["initContainers"]
        assert fetch["command"] == [
            "hf",
            "download",
            "Qwen/Qwen3-Embedding-0.6B",
            "--local-dir",
            "/models/Qwen--Qwen3-Embedding-0.6B/main",
            "--revision",
            "main",
        ]
        volume = next(v for v in pod["volumes"] if v["name"] == "model")
        assert volume["persistentVolumeClaim"] == {"claimName": "model-cache"}
    env = worker_env(parse_spec(raw))
    assert env["EMBEDFLEET_WORKER_MODEL"] == "/models/Qwen--Qwen3-Embedding-0.6B/main"
    assert env["EMBEDFLEET_WORKER_DEVICE"] == "cuda"


@pytest.mark.parametrize(
    ("task", "served"),
    [(None, "auto"), ("embed", "auto"), ("score", "score"), ("classify", "classify"),
     ("sparse", "sparse")],
)  # fmt: skip
def test_model_task_reaches_worker_and_gateway(task: str | None, served: str) -> None:
    """embed (the default) lets the checkpoint decide; the others are the worker's and the
    gateway's --task, so a Qwen3ForCausalLM deployed with task score is a yes/no reranker."""
    model: dict[str, str] = {"source": "pvc://weights/q"}
    if task:
        model["task"] = task
    spec = parse_spec({"model": model})
    assert worker_env(spec)["EMBEDFLEET_WORKER_TASK"] == served
    assert gateway_env(OWNER, spec)["EMBEDFLEET_GATEWAY_TASK"] == served


def test_pvc_source_is_mounted_read_only() -> None:
    raw = {"model": {"source": "pvc://weights/bge/m3"}}
    pod = child_objects(raw)["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert worker_env(parse_spec(raw))["EMBEDFLEET_WORKER_MODEL"] == "/models/bge/m3"


def test_file_source_needs_no_volume() -> None:
    pod = child_objects({"model": {"source": "file:///opt/m"}})["Deployment/minilm-worker"]
    volumes = pod["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["tmp"]


def _hash(raw: dict[str, Any], kind: str) -> str:
    dep = child_objects(raw)[f"Deployment/minilm-{kind}"]
    return str(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH])


def test_a_settings_change_rolls_only_the_pods_that_read_it() -> None:
    base = {"model": {"source": "file:///opt/m"}}
    engine = {**base, "worker": {"engine": {"maxBatchTokens": 4096}}}
    gateway = {**base, "gateway": {"maxClientBatch": 10}}
    scaled = {**base, "worker": {"replicas": 7}}
    assert _hash(engine, "worker") != _hash(base, "worker")
    assert _hash(engine, "gateway") == _hash(base, "gateway")
    assert _hash(gateway, "gateway") != _hash(base, "gateway")
    assert _hash(gateway, "worker") == _hash(base, "worker")
    assert _hash(scaled, "worker") == _hash(base, "worker")


def _fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    "example", ["minilm.yaml", "qwen3-embedding-gpu.yaml", "reranker.yaml", "pplx-embed.yaml"]
)
def test_env_names_are_real_settings(example: str) -> None:
    """Every variable the operator sets is a field of the component's settings object."""
    spec = parse_spec(_example(example))
    worker = {k.removeprefix("EMBEDFLEET_WORKER_").lower() for k in worker_env(spec)}
    gateway = {k.removeprefix("EMBEDFLEET_GATEWAY_").lower() for k in gateway_env(OWNER, spec)}
    assert worker <= _fields(WorkerSettings), worker - _fields(WorkerSettings)
    assert gateway <= gateway_settings(), gateway - gateway_settings()


def test_gateway_discovers_the_headless_worker_service() -> None:
    objs = child_objects(_example("minilm.yaml"))
    headless = objs["Service/minilm-worker"]["spec"]
    assert headless["clusterIP"] == "None"
    assert [p["name"] for p in headless["ports"]] == ["grpc", "metrics"]
    data = objs["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_GATEWAY_K8S_SERVICE"] == "minilm-worker"
    assert data["EMBEDFLEET_GATEWAY_K8S_PORT_NAME"] == "grpc"
    pod = objs["Deployment/minilm-gateway"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "minilm-gateway"
    (rule,) = objs["Role/minilm-gateway"]["rules"]
    assert rule == {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"],
    }
    binding = objs["RoleBinding/minilm-gateway"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "minilm-gateway", "namespace": "ml"}
    ]


def test_service_monitor_only_when_asked_and_possible() -> None:
    raw = {"model": {"source": "file:///m"}, "monitoring": {"serviceMonitor": {"enabled": True}}}
    assert "ServiceMonitor/minilm" in child_objects(raw, monitors=True)
    assert "ServiceMonitor/minilm" not in child_objects(raw, monitors=False)
    off = {"model": {"source": "file:///m"}}
    assert "ServiceMonitor/minilm" not in child_objects(off, monitors=True)


def test_user_settings_reach_the_pods() -> None:
    raw = {
        "model": {"source": "file:///m", "maxInputTokens": 128, "dtype": "float32"},
        "worker": {
            "scheduling": {"priorityClassName": "high", "tolerations": [{"key": "a"}]},
            "imagePullPolicy": "Always",
            "image": "mine/worker:2",
        },
        "gateway": {"service": {"type": "LoadBalancer", "port": 8000}},
        "imagePullSecrets": [{"name": "regcred"}],
    }
    objs = child_objects(raw)
    pod = objs["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "high"
    assert pod["tolerations"] == [{"key": "a"}]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["image"] == "mine/worker:2"
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    svc = objs["Service/minilm"]["spec"]
    assert svc["type"] == "LoadBalancer"
    assert svc["ports"][0]["port"] == 8000
    data = objs["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_MAX_INPUT_TOKENS"] == "128"
    assert data["EMBEDFLEET_WORKER_DTYPE"] == "float32"
    assert data["EMBEDFLEET_WORKER_DEVICE"] == "cpu"


def _probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    kinds = ("startupProbe", "readinessProbe", "livenessProbe")
    return {kind: container[kind] for kind in kinds if kind in container}


@pytest.mark.parametrize("example", ["minilm.yaml", "qwen3-embedding-gpu.yaml", "reranker.yaml"])
def test_probes_and_services_target_declared_ports(example: str) -> None:
    objs = child_objects(_example(example))
    pods = {
        component: objs[f"Deployment/minilm-{component}"]["spec"]["template"]["spec"]
        for component in ("worker", "gateway")
    }
    for pod in pods.values():
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for kind, probe in _probes(container).items():
            if "grpc" in probe:
                assert probe["grpc"]["port"] in ports.values(), kind
            else:
                assert probe["httpGet"]["port"] in ports, kind
            # kubelet's default timeout is 1 s, too short for a loaded node.
            assert probe["timeoutSeconds"] >= 5, kind
    for service, component in (("minilm-worker", "worker"), ("minilm", "gateway")):
        (container,) = pods[component]["containers"]
        names = {p["name"] for p in container["ports"]}
        for port in objs[f"Service/{service}"]["spec"]["ports"]:
            assert port["targetPort"] in names, (service, port)


def test_worker_start_up_may_take_minutes_and_readiness_follows_it_soon() -> None:
    dep = child_objects(_example("minilm.yaml"))["Deployment/minilm-worker"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    # Readiness is probed only after start-up succeeded: at most these seconds after SERVING
    # (the cold start from zero waits on it: docs/autoscaling.md).
    readiness = container["readinessProbe"]
    assert startup["periodSeconds"] + readiness["periodSeconds"] <= 2
    # kubelet probes one at a time: a silent worker fails one probe per max(period, timeout).
    liveness = container["livenessProbe"]
    leaves, restarted = (
        p["failureThreshold"] * max(p["periodSeconds"], p["timeoutSeconds"])
        for p in (readiness, liveness)
    )
    # A hung worker leaves the Service after ~10 s (not one slow answer), long before it is
    # restarted: a frozen worker that thaws is kept (tests/observability, the hung worker).
    assert 10 <= leaves <= 15
    assert restarted >= 4 * leaves


def test_grace_periods_cover_the_pre_stop_sleep_and_the_drain() -> None:
    raw = {"model": {"source": "file:///m"}, "worker": {"drainSeconds": 50}}
    objs = child_objects(raw)
    for component, drain in (("worker", 50), ("gateway", 60)):
        pod = objs[f"Deployment/minilm-{component}"]["spec"]["template"]["spec"]
        pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pod["terminationGracePeriodSeconds"] > pre_stop + drain, component


@pytest.mark.parametrize(
    ("resources", "threads"),
    [
        ({}, None),
        ({"requests": {"cpu": "250m"}}, "1"),
        ({"requests": {"cpu": "1"}}, "1"),
        ({"requests": {"cpu": "1500m"}}, "2"),
        ({"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}, "4"),
        ({"limits": {"cpu": "2.5"}}, "3"),
        ({"requests": {"memory": "1Gi"}}, None),
    ],
)
def test_worker_threads_follow_the_pods_cpu_share(
    resources: dict[str, Any], threads: str | None
) -> None:
    raw = {"model": {"source": "file:///m"}, "worker": {"resources": resources}}
    data = child_objects(raw)["ConfigMap/minilm-config"]["data"]
    # "0" keeps torch's default: a pod with no CPU figure may use the node's cores.
    assert data["EMBEDFLEET_WORKER_THREADS"] == (threads or "0")


def test_gateway_auth_and_calibration_are_mounted_as_updatable_files() -> None:
    raw = {
        "model": {"source": "file:///m"},
        "gateway": {
            "auth": {"secretRef": {"name": "team-keys"}, "perKeyMetrics": True},
            "quantization": {"configMapRef": {"name": "minilm-ranges", "key": "q.json"}},
            "splitLongInputs": True,
            "splitOverlapTokens": 16,
        },
    }
    objs = child_objects(raw)
    pod = objs["Deployment/minilm-gateway"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["api-keys"]["secret"] == {
        "secretName": "team-keys",
        "items": [{"key": "api-keys", "path": "api-keys"}],
        "defaultMode": 0o440,
    }
    assert volumes["quantization"]["configMap"] == {
        "name": "minilm-ranges",
        "items": [{"key": "q.json", "path": "embedfleet_quantization.json"}],
    }
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    # No subPath: the kubelet updates only whole volume mounts when the Secret changes.
    assert mounts["api-keys"] == {
        "name": "api-keys",
        "mountPath": "/etc/embedfleet/auth",
        "readOnly": True,
    }
    assert not any("subPath" in m for m in container["volumeMounts"])
    data = objs["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_GATEWAY_API_KEYS_FILE"] == "/etc/embedfleet/auth/api-keys"
    assert data["EMBEDFLEET_GATEWAY_API_KEY_METRICS"] == "true"
    assert (
        data["EMBEDFLEET_GATEWAY_QUANTIZATION_FILE"]
        == "/etc/embedfleet/quantization/embedfleet_quantization.json"
    )
    assert data["EMBEDFLEET_GATEWAY_SPLIT_LONG_INPUTS"] == "true"
    assert data["EMBEDFLEET_GATEWAY_SPLIT_OVERLAP_TOKENS"] == "16"
    # The workers read none of it, and roll for none of it.
    worker = objs["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    assert {v["name"] for v in worker["volumes"]} == {"tmp"}
    base = {"model": {"source": "file:///m"}}
    assert _hash(base, "worker") == _hash(raw, "worker")
    assert _hash(base, "gateway") != _hash(raw, "gateway")
    plain = child_objects(base)
    gateway_volumes = plain["Deployment/minilm-gateway"]["spec"]["template"]["spec"]["volumes"]
    assert {v["name"] for v in gateway_volumes} == {"tmp"}
    assert plain["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_GATEWAY_API_KEYS_FILE"] == ""


def test_a_gateway_setting_from_the_env_is_what_the_operator_meant() -> None:
    """The rendered values as the binary reads them (tests/gateway/test_operator_env.py starts it
    from them)."""
    raw = {
        "model": {"source": "file:///m"},
        "gateway": {
            "auth": {"secretRef": {"name": "k"}},
            "splitLongInputs": True,
            "maxQueueSeconds": 4.5,
        },
    }
    env = gateway_env(OWNER, parse_spec(raw))
    assert env["EMBEDFLEET_GATEWAY_API_KEYS_FILE"] == "/etc/embedfleet/auth/api-keys"
    assert env["EMBEDFLEET_GATEWAY_SPLIT_LONG_INPUTS"] == "true"
    assert env["EMBEDFLEET_GATEWAY_API_KEY_METRICS"] == "false"
    assert env["EMBEDFLEET_GATEWAY_QUANTIZATION_FILE"] == ""
    assert env["EMBEDFLEET_GATEWAY_MAX_QUEUE_SECONDS"] == "4.5"
    # the CRD's default is the gateway's (gateway/contract/settings.md)
    assert parse_spec({"model": {"source": "file:///m"}}).gateway.max_queue_seconds == 30.0


@pytest.mark.parametrize("stored", [{}, {"implementation": "python"}, {"implementation": "rust"}])
def test_the_gateway_pod_runs_the_binary_whatever_a_stored_fleet_says(
    stored: dict[str, str],
) -> None:
    """gateway.implementation is gone: an object stored before the CRD pruned it renders as one
    that never set it."""
    objs = child_objects({"model": {"source": "file:///m"}, "gateway": stored})
    assert objs == child_objects({"model": {"source": "file:///m"}})
    pod = objs["Deployment/minilm-gateway"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["embedfleet-gateway"]
    assert container["image"] == IMAGES.gateway
    assert objs["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_GATEWAY_K8S_SERVICE"] == (
        "minilm-worker"
    )


@pytest.mark.parametrize(("gpus", "image"), [(0, "cpu"), (1, "gpu")])
def test_an_hf_model_is_fetched_for_the_gateway_by_the_fleets_worker_image(
    gpus: int, image: str
) -> None:
    """The gateway image holds the binary alone; the worker image has `hf`."""
    images = Images(worker="reg/worker:gpu", gateway="reg/gateway:1", worker_cpu="reg/worker:cpu")
    raw = {"model": {"source": "hf://BAAI/bge-small-en-v1.5"}, "worker": {"gpus": gpus}}
    by_name = _by_key(children(OWNER, parse_spec(raw), 1, images, False))
    pod = by_name["Deployment/minilm-gateway"]["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["image"] == f"reg/worker:{image}"
    assert fetch["command"][:2] == ["hf", "download"]
    assert pod["containers"][0]["image"] == "reg/gateway:1"
    own = {**raw, "worker": {"gpus": gpus, "image": "mine/worker:2", "imagePullPolicy": "Always"}}
    by_name = _by_key(children(OWNER, parse_spec(own), 1, images, False))
    (fetch,) = by_name["Deployment/minilm-gateway"]["spec"]["template"]["spec"]["initContainers"]
    assert (fetch["image"], fetch["imagePullPolicy"]) == ("mine/worker:2", "Always")


def test_the_gateway_is_traced_by_the_same_settings() -> None:
    raw = {
        "model": {"source": "file:///m"},
        "monitoring": {"tracing": {"endpoint": "http://otel:4317", "sampleRatio": 0.25}},
    }
    objs = child_objects(raw)
    data = objs["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_GATEWAY_TRACING_ENDPOINT"] == "http://otel:4317"
    assert data["EMBEDFLEET_GATEWAY_TRACING_SAMPLE_RATIO"] == "0.25"
    assert data["EMBEDFLEET_GATEWAY_TRACING_SERVICE_NAME"] == "embedfleet-gateway"


def test_graph_settings_reach_the_worker() -> None:
    # Finding 2: the CRD's cudaGraphs modes had no bucket settings behind them.
    raw = {
        "model": {"source": "file:///m"},
        "worker": {
            "gpus": 1,
            "engine": {
                "cudaGraphs": "eager",
                "graphBuckets": [128, 512, 4096],
                "maxGraphs": 48,
                "tokenBuckets": "linear",
                "tokenBucketsPerOctave": 8,
                "tokenBucketSwitch": 2048,
                "tokenBucketLargeStep": 512,
                "sequenceBuckets": "pow2",
            },
        },
    }
    data = child_objects(raw)["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_CUDA_GRAPHS"] == "eager"
    assert data["EMBEDFLEET_WORKER_GRAPH_BUCKETS"] == "128,512,4096"
    assert data["EMBEDFLEET_WORKER_MAX_GRAPHS"] == "48"
    assert data["EMBEDFLEET_WORKER_TOKEN_BUCKETS"] == "linear"
    assert data["EMBEDFLEET_WORKER_TOKEN_BUCKETS_PER_OCTAVE"] == "8"
    assert data["EMBEDFLEET_WORKER_TOKEN_BUCKET_SWITCH"] == "2048"
    assert data["EMBEDFLEET_WORKER_TOKEN_BUCKET_LARGE_STEP"] == "512"
    assert data["EMBEDFLEET_WORKER_SEQUENCE_BUCKETS"] == "pow2"
    # And the worker reads them back as the engine's bucket policy.
    from embedfleet.common.settings import load
    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.settings import ENV_PREFIX

    env = {k: v for k, v in data.items() if k.startswith(ENV_PREFIX)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        config = EngineConfig.from_settings(load(WorkerSettings, ENV_PREFIX, []))
    assert config.graph_buckets == (128, 512, 4096)
    assert config.max_graphs == 48
    assert config.buckets.token_scheme == "linear"
    assert config.buckets.per_octave == 8
    assert config.buckets.token_switch == 2048
    assert config.buckets.sequence_scheme == "pow2"
    defaults = child_objects({"model": {"source": "file:///m"}})["ConfigMap/minilm-config"]["data"]
    assert defaults["EMBEDFLEET_WORKER_TOKEN_BUCKETS"] == "geometric"
    assert "EMBEDFLEET_WORKER_GRAPH_BUCKETS" not in defaults
    assert "EMBEDFLEET_WORKER_ENGINES" not in defaults


@pytest.mark.parametrize("gpus", [0, 1])
def test_engines_per_gpu_gives_one_port_per_engine_everywhere(gpus: int) -> None:
    raw = {
        "model": {"source": "file:///m"},
        "worker": {"gpus": gpus, "enginesPerGPU": 3},
        "monitoring": {"serviceMonitor": {"enabled": True}},
    }
    objs = child_objects(raw, monitors=True)
    assert objs["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_WORKER_ENGINES"] == "3"
    pod = objs["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    # One container: the device plugin gives a GPU to one container, so the engines share it
    # as processes of that container.
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": 50051,
        "metrics": 9090,
        "grpc-1": 50052,
        "metrics-1": 9091,
        "grpc-2": 50053,
        "metrics-2": 9092,
    }
    if gpus:
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    service = objs["Service/minilm-worker"]["spec"]["ports"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service} == {
        name: (port, name) for name, port in ports.items()
    }
    monitor = objs["ServiceMonitor/minilm"]["spec"]["endpoints"]
    assert [e["port"] for e in monitor] == ["metrics", "metrics-1", "metrics-2", "http"]
    # The gateway takes the port named by its setting and that name's numbered siblings (-1, -2)
    # as one endpoint each (the gateway's discovery; tests/e2e/test_engines_per_pod.py).
    port_name = objs["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_GATEWAY_K8S_PORT_NAME"]
    assert port_name == "grpc"
    assert [p["name"] for p in service if p["name"].startswith(port_name)] == [
        "grpc", "grpc-1", "grpc-2"]  # fmt: skip


TRACED = {
    "model": {"source": "file:///opt/m"},
    "monitoring": {"tracing": {"endpoint": "http://otel.obs:4317", "sampleRatio": 0.25}},
}


def test_tracing_reaches_both_components_as_their_settings() -> None:
    spec = parse_spec(TRACED)
    worker, gateway = worker_env(spec), gateway_env(OWNER, spec)
    assert worker["EMBEDFLEET_WORKER_TRACING_ENDPOINT"] == "http://otel.obs:4317"
    assert worker["EMBEDFLEET_WORKER_TRACING_SAMPLE_RATIO"] == "0.25"
    assert worker["EMBEDFLEET_WORKER_TRACING_SERVICE_NAME"] == "embedfleet-worker"
    assert gateway["EMBEDFLEET_GATEWAY_TRACING_ENDPOINT"] == "http://otel.obs:4317"
    assert gateway["EMBEDFLEET_GATEWAY_TRACING_SAMPLE_RATIO"] == "0.25"
    assert gateway["EMBEDFLEET_GATEWAY_TRACING_SERVICE_NAME"] == "embedfleet-gateway"
    # The pods read them from the config map, and a change rolls both.
    data = child_objects(TRACED)["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_TRACING_ENDPOINT"] == "http://otel.obs:4317"
    assert data["EMBEDFLEET_GATEWAY_TRACING_ENDPOINT"] == "http://otel.obs:4317"
    base = {"model": TRACED["model"]}
    assert _hash(TRACED, "worker") != _hash(base, "worker")
    assert _hash(TRACED, "gateway") != _hash(base, "gateway")
    # The rendered values parse as the settings the processes load.
    fields = _fields(WorkerSettings) & gateway_settings()
    assert {"tracing_endpoint", "tracing_sample_ratio", "tracing_service_name"} <= fields


def test_no_tracing_endpoint_renders_no_tracing_settings() -> None:
    for raw in ({"model": TRACED["model"]}, {**TRACED, "monitoring": {"tracing": {}}}):
        spec = parse_spec(raw)
        env = {**worker_env(spec), **gateway_env(OWNER, spec)}
        assert not [k for k in env if "TRACING" in k]


def test_a_fleet_that_may_scale_to_zero_has_gateways_that_hold_requests() -> None:
    """With minReplicas 0 the gateway must stay Ready and hold requests, or nothing wakes it."""
    raw = _example("minilm.yaml")
    hold = "EMBEDFLEET_GATEWAY_HOLD_REQUESTS"
    assert child_objects(raw)["ConfigMap/minilm-config"]["data"][hold] == "0"
    raw["autoscaling"] = {"enabled": True, "minReplicas": 0, "maxReplicas": 3}
    assert int(child_objects(raw)["ConfigMap/minilm-config"]["data"][hold]) > 0
    raw["autoscaling"]["minReplicas"] = 1
    assert child_objects(raw)["ConfigMap/minilm-config"]["data"][hold] == "0"


def test_worker_memory_settings_reach_the_worker() -> None:
    raw = {
        "model": {"source": "file:///m"},
        "worker": {
            "memory": {
                "maxInflightBytes": 1 << 30,
                "libraryCacheCapacity": 0,
                "mallocTrimSeconds": 0.5,
            }
        },
    }
    data = child_objects(raw)["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_MAX_INFLIGHT_BYTES"] == str(1 << 30)
    assert data["EMBEDFLEET_WORKER_LIBRARY_CACHE_CAPACITY"] == "0"
    assert data["EMBEDFLEET_WORKER_MALLOC_TRIM_SECONDS"] == "0.5"
    # Unset, they are the worker's own defaults.
    from embedfleet.common.settings import load
    from embedfleet.worker.settings import ENV_PREFIX

    defaults = load(WorkerSettings, ENV_PREFIX, [])
    plain = child_objects({"model": {"source": "file:///m"}})["ConfigMap/minilm-config"]["data"]
    assert plain["EMBEDFLEET_WORKER_MAX_INFLIGHT_BYTES"] == str(defaults.max_inflight_bytes)
    assert plain["EMBEDFLEET_WORKER_LIBRARY_CACHE_CAPACITY"] == str(defaults.library_cache_capacity)
    assert float(plain["EMBEDFLEET_WORKER_MALLOC_TRIM_SECONDS"]) == defaults.malloc_trim_seconds


def _worker_engine(data: dict[str, str]) -> Any:
    """The EngineConfig a worker builds from a rendered config map."""
    from embedfleet.common.settings import load
    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.settings import ENV_PREFIX

    with pytest.MonkeyPatch.context() as mp:
        for k, v in data.items():
            if k.startswith(ENV_PREFIX):
                mp.setenv(k, v)
        return EngineConfig.from_settings(load(WorkerSettings, ENV_PREFIX, []))


@pytest.mark.parametrize("runtime", ["eager", "inductor", "openvino"])
def test_the_cpu_runtime_reaches_the_worker(runtime: str) -> None:
    raw = {"model": {"source": "file:///m"}, "worker": {"engine": {"cpuRuntime": runtime}}}
    data = child_objects(raw)["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_CPU_RUNTIME"] == runtime
    assert _worker_engine(data).cpu_runtime == runtime
    # No claim to share: the graph stays in the pod's own cache (its /tmp emptyDir).
    assert "EMBEDFLEET_WORKER_OPENVINO_CACHE_DIR" not in data


def test_auto_cpu_runtime_renders_nothing_so_no_fleet_rolls() -> None:
    """A fleet that never set cpuRuntime (or set the default) keeps its config hash across the
    operator upgrade that added the field."""
    base = {"model": {"source": "file:///opt/m"}}
    auto = {**base, "worker": {"engine": {"cpuRuntime": "auto"}}}
    data = child_objects(auto)["ConfigMap/minilm-config"]["data"]
    assert "EMBEDFLEET_WORKER_CPU_RUNTIME" not in data
    assert _worker_engine(data).cpu_runtime == "auto"
    assert _hash(auto, "worker") == _hash(base, "worker")
    chosen = {**base, "worker": {"engine": {"cpuRuntime": "openvino"}}}
    assert _hash(chosen, "worker") != _hash(base, "worker")


def _worker_settings(data: dict[str, str]) -> WorkerSettings:
    """The settings a worker loads from a rendered config map."""
    from embedfleet.common.settings import load
    from embedfleet.worker.settings import ENV_PREFIX

    with pytest.MonkeyPatch.context() as mp:
        for k, v in data.items():
            if k.startswith(ENV_PREFIX):
                mp.setenv(k, v)
        return load(WorkerSettings, ENV_PREFIX, [])


def test_the_rust_front_reaches_the_worker_without_a_library_path() -> None:
    """worker.front rust is the worker's --front; the images carry the extension, so no
    --front-library is rendered (the worker imports embedfleet_front from site-packages)."""
    raw = {"model": {"source": "file:///m"}, "worker": {"front": "rust"}}
    data = child_objects(raw)["ConfigMap/minilm-config"]["data"]
    assert data["EMBEDFLEET_WORKER_FRONT"] == "rust"
    assert "EMBEDFLEET_WORKER_FRONT_LIBRARY" not in data
    settings = _worker_settings(data)
    assert (settings.front, settings.front_library) == ("rust", "")


def test_the_rust_front_is_the_default_and_python_renders_nothing() -> None:
    """A fleet that never set worker.front serves through the Rust front; one that chose python
    renders nothing (the worker's own default), so its config hash is the one it had before the
    field existed. The front is the workers' alone: the gateway's hash does not move."""
    base = {"model": {"source": "file:///opt/m"}}
    assert child_objects(base)["ConfigMap/minilm-config"]["data"]["EMBEDFLEET_WORKER_FRONT"] == (
        "rust"
    )
    rust = {**base, "worker": {"front": "rust"}}
    assert _hash(rust, "worker") == _hash(base, "worker")
    python = {**base, "worker": {"front": "python"}}
    data = child_objects(python)["ConfigMap/minilm-config"]["data"]
    assert "EMBEDFLEET_WORKER_FRONT" not in data
    assert _worker_settings(data).front == "python"
    assert _hash(python, "worker") != _hash(base, "worker")
    assert _hash(python, "gateway") == _hash(base, "gateway")


def test_openvino_graphs_are_cached_in_the_model_cache_claim() -> None:
    """With a shared model cache claim only a fleet's first pod converts (most of a new pod's
    start-up); the claim is the one volume a worker may write that outlives it."""
    raw: dict[str, Any] = {
        "model": {"source": "hf://org/model", "cache": {"claimName": "models"}},
        "worker": {"engine": {"cpuRuntime": "openvino"}},
    }
    objs = child_objects(raw)
    data = objs["ConfigMap/minilm-config"]["data"]
    cache = data["EMBEDFLEET_WORKER_OPENVINO_CACHE_DIR"]
    assert _worker_engine(data).openvino_cache_dir == cache
    pod = objs["Deployment/minilm-worker"]["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if cache.startswith(m["mountPath"])]
    assert not mount.get("readOnly")
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == "models"
    # An emptyDir model cache dies with the pod, a pvc:// model is mounted read-only, eager
    # reads no graph: none of them gets a cache directory.
    for other in (
        {**raw, "model": {"source": "hf://org/model"}},
        {**raw, "model": {"source": "pvc://models/m"}},
        {**raw, "worker": {"engine": {"cpuRuntime": "eager"}}},
    ):
        data = child_objects(other)["ConfigMap/minilm-config"]["data"]
        assert "EMBEDFLEET_WORKER_OPENVINO_CACHE_DIR" not in data
