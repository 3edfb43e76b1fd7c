"""embedfleet test harness: a real Kubernetes control plane on 127.0.0.1 for tests and local dev.

Entry points: `embedfleet.testing.cluster.Cluster`, the pytest plugin
`embedfleet.testing.pytest_plugin` and `hack/dev-cluster` (`embedfleet.testing.devcluster`).
"""
