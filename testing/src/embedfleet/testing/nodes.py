"""Fake nodes for KWOK: Node objects it adopts, heartbeats and runs pods on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# KWOK manages the nodes carrying this annotation (its --manage-nodes-with-annotation-selector).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeShape:
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"


def fake_gpu_node(name: str, shape: NodeShape, kube_version: str) -> dict[str, Any]:
    """A Node advertising `shape.gpus` nvidia.com/gpu, labelled the way GPU feature discovery does.

    No taint: every node in this cluster is fake, so workloads need no toleration to land on one.
    """
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        GPU_RESOURCE: str(shape.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "kwok-gpu",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(shape.gpus),
                "nvidia.com/gpu.product": shape.gpu_product,
                "type": "kwok",
            },
        },
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "kubeletVersion": kube_version,
                "operatingSystem": "linux",
            },
        },
    }


def node_is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
