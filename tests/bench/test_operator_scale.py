"""The operator-scale benchmark's pure parts: when the API server recorded the operator's apply."""

from __future__ import annotations

from datetime import UTC, datetime

from embedfleet.bench.operator_scale import applied_at, change_applied_p99, latencies
from embedfleet.operator.manifests import MANAGER


def _entry(manager: str, operation: str, stamp: str, subresource: str = "") -> dict[str, str]:
    entry = {"manager": manager, "operation": operation, "time": stamp}
    if subresource:
        entry["subresource"] = subresource
    return entry


def test_the_operators_apply_is_read_from_managed_fields() -> None:
    obj = {
        "metadata": {
            "managedFields": [
                _entry("kube-controller-manager", "Update", "2026-12-02T00:00:09Z", "status"),
                _entry(MANAGER, "Apply", "2026-12-02T00:00:05Z"),
                _entry("kubectl", "Apply", "2026-12-02T00:00:01Z"),
            ]
        }
    }
    assert applied_at(obj) == datetime(2026, 12, 2, 0, 0, 5, tzinfo=UTC).timestamp()


def test_no_apply_of_the_operator_is_no_time() -> None:
    only_status = {"metadata": {"managedFields": [_entry(MANAGER, "Update", "x", "status")]}}
    assert applied_at(only_status) is None
    assert applied_at({"metadata": {}}) is None


def test_latencies_count_what_never_arrived() -> None:
    got = latencies({"a": 10.0, "b": 20.0, "c": 30.0}, {"a": 11.0, "b": 24.0})
    assert (got["count"], got["missing"]) == (2, 1)
    assert (got["p50_s"], got["p99_s"], got["max_s"]) == (1.0, 4.0, 4.0)


def test_the_change_target_reads_the_api_servers_record_rounded_up() -> None:
    watch = {"p99_s": 20.0}
    assert change_applied_p99({"applied": watch, "applied_server": {"p99_s": 3.68}}) == 4.68
    assert change_applied_p99({"applied": watch}) == 20.0  # an older run: no record read
    assert change_applied_p99({"applied": watch, "applied_server": {"p99_s": None}}) == 20.0
