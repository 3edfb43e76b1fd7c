"""Schemathesis against the gateway's own /openapi.json (FAKE workers behind it, fakes.py): bounded,
seeded examples per operation, every default check (no 5xx, documented status codes, content
types, response schemas, schema-invalid input refused) but one: "schema-valid input accepted" cannot
hold, since some refusals depend on what no schema states (an input's length in tokens, a token id
past this model's vocabulary, 306.0 as a token id: JSON Schema calls it an integer, strict
validation does not)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

KEY = "sk-fuzz-0123456789"


@pytest.fixture(scope="module")
def gateway(fake_fleet_gateway: GatewayThread) -> GatewayThread:
    return fake_fleet_gateway


OPERATIONS = [
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/score"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/openapi.json"),
]


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_the_gateway_keeps_its_own_contract(gateway: GatewayThread, method: str, path: str) -> None:
    api = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    operation = api[path][method]
    seen: list[int] = []

    @given(case=operation.as_strategy())
    @settings(
        max_examples=40,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: schemathesis.Case) -> None:
        response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
        seen.append(response.status_code)

    check()
    assert seen  # examples were generated and answered


@pytest.fixture(scope="module")
def keyed_gateway(minilm: ModelDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same gateway with an API key: its document declares the bearer scheme on /v1/*."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEY + "\n")
    workers = [FakeWorker(i).start() for i in range(2)]
    settings = GatewaySettings(
        workers=tuple(w.address for w in workers), probe_seconds=0.1, api_keys_file=str(keys)
    )
    gw = GatewayThread(settings, minilm).start()
    try:
        wait_until("workers ready", lambda: len(gw.app.balancer.usable()) == 2)
        yield gw.url
    finally:
        gw.stop()
        for w in workers:
            w.stop()


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/embeddings"), ("GET", "/v1/models")])
def test_with_keys_the_contract_holds_with_and_without_one(
    keyed_gateway: str, method: str, path: str
) -> None:
    api = schemathesis.openapi.from_url(keyed_gateway + "/openapi.json")
    operation = api[path][method]
    seen: dict[bool, list[int]] = {True: [], False: []}

    @given(case=operation.as_strategy())
    @settings(
        max_examples=20,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: schemathesis.Case) -> None:
        for keyed in (True, False):
            headers = {"Authorization": f"Bearer {KEY}"} if keyed else {}
            response = case.call_and_validate(
                headers=headers, excluded_checks=[positive_data_acceptance]
            )
            seen[keyed].append(response.status_code)

    check()
    assert set(seen[False]) <= {401, 405}, seen[False]
    assert 401 in seen[False]
    assert 401 not in seen[True]
