"""Schemathesis against the binary's own /openapi.json (FAKE workers behind it, fakes.py): bounded,
seeded examples per operation, every default check (no 5xx, documented status codes, content
types, response schemas, schema-invalid input refused) but one: "schema-valid input accepted"
cannot hold, since some refusals depend on what no schema states (an input's length in tokens, a
token id past this model's vocabulary, 306.0 as a token id: JSON Schema calls it an integer,
strict validation does not). Schema-invalid bodies too, each refused with a 4xx."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from .helpers import LIMITS, Gateway, fake_fleet

KEY = "sk-fuzz-0123456789"
#: a generated case, of whichever operation
Case = schemathesis.Case[Any]

OPERATIONS = [
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/score"),
    ("POST", "/v1/classify"),
    ("POST", "/v1/sparse_embeddings"),
    ("POST", "/v1/multi-vector"),
    ("POST", "/v1/hybrid-embeddings"),
    # TEI's and Cohere's routes (docs/clients.md)
    ("POST", "/"),
    ("POST", "/embed"),
    ("POST", "/embed_sparse"),
    ("POST", "/embed_all"),
    ("POST", "/rerank"),
    ("POST", "/predict"),
    ("POST", "/similarity"),
    ("POST", "/tokenize"),
    ("POST", "/decode"),
    ("GET", "/info"),
    ("POST", "/v2/embed"),
    ("POST", "/v2/rerank"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
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


def validated(case: Case, tei_413: bool = False, **kw: Any) -> int:
    """The case sent to the document's gateway and its answer checked against the document
    (every check but positive_data_acceptance: see the top); its status. `tei_413`: a refusal
    may be TEI's 413 (a request the model cannot take, before a field's shape is read), which
    schemathesis's negative_data_rejection does not count as a refusal; the test's own 4xx
    assertion stands in for it."""
    excluded = [positive_data_acceptance] + ([negative_data_rejection] if tei_413 else [])
    return int(case.call_and_validate(excluded_checks=excluded, **kw).status_code)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_the_gateway_keeps_its_own_contract(fakes: Gateway, method: str, path: str) -> None:
    seen: list[int] = []
    fuzz(fakes.url, method, path, 40, lambda case: seen.append(validated(case)))
    assert seen  # examples were generated and answered
    assert max(seen) < 500
    fakes.calls()


@pytest.mark.parametrize(("method", "path"), [op for op in OPERATIONS if op[0] == "POST"])
def test_schema_invalid_bodies_are_refused(fakes: Gateway, method: str, path: str) -> None:
    seen: list[int] = []
    tei = not path.startswith(("/v1/", "/v2/"))

    def check(case: Case) -> None:
        seen.append(validated(case, tei_413=tei))

    fuzz(fakes.url, method, path, 40, check, GenerationMode.NEGATIVE)
    assert seen
    assert all(400 <= s < 500 for s in seen), seen
    assert fakes.calls() == []


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway with an API key: its document declares the bearer scheme on every keyed
    route (/v1/, /v2/ and TEI's)."""
    directory = tmp_path_factory.mktemp("schema_fuzz_keys")
    keys = directory / "keys"
    keys.write_text(KEY + "\n")
    with fake_fleet({**LIMITS, "api_keys_file": keys}, directory / "gateway.log") as gateway:
        yield gateway.url


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/embeddings"), ("POST", "/embed"), ("POST", "/v2/embed"), ("GET", "/v1/models")],
)
def test_with_keys_the_contract_holds_with_and_without_one(
    keyed: str, method: str, path: str
) -> None:
    """Each case sent with KEY and without it (then with no Authorization, or a bearer
    schemathesis made up from the document's scheme): without KEY it is refused (401, or 405
    for a method the path does not take), with it never 401."""
    seen: dict[bool, list[int]] = {True: [], False: []}

    def check(case: Case) -> None:
        for with_key in (True, False):
            headers = {"Authorization": f"Bearer {KEY}"} if with_key else {}
            seen[with_key].append(validated(case, headers=headers))

    fuzz(keyed, method, path, 20, check)
    assert set(seen[False]) <= {401, 405}, seen[False]
    assert 401 in seen[False]
    assert 401 not in seen[True]
