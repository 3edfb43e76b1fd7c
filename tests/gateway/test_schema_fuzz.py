"""Schemathesis against the gateway's own /openapi.json (FAKE workers behind it, fakes.py): bounded,
seeded examples per operation, every default check (no 5xx, documented status codes, content
types, response schemas, schema-invalid input refused) but one: "schema-valid input accepted" cannot
hold, since some refusals depend on what no schema states (an input's length in tokens, a token id
past this model's vocabulary, 306.0 as a token id: JSON Schema calls it an integer, strict
validation does not)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

KEY = "sk-fuzz-0123456789"
#: a generated case, of whichever operation
Case = schemathesis.Case[Any]


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


def fuzz(
    url: str,
    method: str,
    path: str,
    examples: int,
    check: Callable[[Case], None],
    mode: GenerationMode = GenerationMode.POSITIVE,
) -> None:
    """`check` on `examples` seeded cases (`mode`: schema-valid or not) of `method path` in the
    document the gateway at `url` serves (the same cases each run: a failure found recurs)."""
    operation = schemathesis.openapi.from_url(url + "/openapi.json")[path][method]

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def each(case: Case) -> None:
        check(case)

    each()


def validated(case: Case, **kw: Any) -> schemathesis.Response:
    """The case sent (to the document's gateway, unless `kw` names a base_url) and its answer
    checked against the document (every check but positive_data_acceptance: see the top)."""
    return case.call_and_validate(excluded_checks=[positive_data_acceptance], **kw)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_the_gateway_keeps_its_own_contract(gateway: GatewayThread, method: str, path: str) -> None:
    seen: list[int] = []
    fuzz(gateway.url, method, path, 40, lambda case: seen.append(validated(case).status_code))
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


#: the operations fuzzed with and without the key: one served per request, one listing
KEYED_OPERATIONS = [("POST", "/v1/embeddings"), ("GET", "/v1/models")]


def assert_keys_hold(
    url: str, method: str, path: str, send: Callable[[Case, dict[str, str]], int]
) -> None:
    """Each case sent (`send`, with the headers to add; it returns the status) with KEY and
    without it (then with no Authorization, or a bearer schemathesis made up from the document's
    scheme): without KEY it is refused (401 or 405), with it never 401."""
    seen: dict[bool, list[int]] = {True: [], False: []}

    def check(case: Case) -> None:
        for keyed in (True, False):
            headers = {"Authorization": f"Bearer {KEY}"} if keyed else {}
            seen[keyed].append(send(case, headers))

    fuzz(url, method, path, 20, check)
    assert set(seen[False]) <= {401, 405}, seen[False]
    assert 401 in seen[False]
    assert 401 not in seen[True]


@pytest.mark.parametrize(("method", "path"), KEYED_OPERATIONS)
def test_with_keys_the_contract_holds_with_and_without_one(
    keyed_gateway: str, method: str, path: str
) -> None:
    assert_keys_hold(
        keyed_gateway,
        method,
        path,
        lambda case, headers: validated(case, headers=headers).status_code,
    )
