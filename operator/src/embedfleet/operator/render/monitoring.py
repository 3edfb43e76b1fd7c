"""The ServiceMonitor that has a Prometheus Operator scrape a fleet's workers and gateway."""

from __future__ import annotations

from embedfleet.operator.manifests import (
    LABEL_INSTANCE,
    LABEL_NAME,
    Manifest,
    Owner,
    metadata,
)
from embedfleet.operator.render.workers import engine_ports
from embedfleet.operator.spec import Spec


def service_monitor(owner: Owner, spec: Spec) -> Manifest:
    monitor = spec.service_monitor
    meta = metadata(owner, owner.name, "monitoring")
    meta["labels"] = {**meta["labels"], **monitor.labels}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {LABEL_NAME: "embedfleet", LABEL_INSTANCE: owner.name}},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            # Each endpoint matches only the Service that has a port of that name.
            "endpoints": [
                *(
                    {"port": metrics, "interval": monitor.interval}
                    for _, _, metrics, _ in engine_ports(spec.worker.engines_per_gpu)
                ),
                {"port": "http", "path": "/metrics", "interval": monitor.interval},
            ],
        },
    }
