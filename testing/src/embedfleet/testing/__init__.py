"""embedfleet test harness: a real Kubernetes control plane on 127.0.0.1, and real or stub workers.

Entry points: `embedfleet.testing.cluster.Cluster`, the pytest plugin
`embedfleet.testing.pytest_plugin`, `hack/dev-cluster` (`embedfleet.testing.devcluster`), worker
processes (`embedfleet.testing.workers`, `embedfleet.testing.stub_worker`) and the one wait helper
(`embedfleet.testing.polling`).
"""
