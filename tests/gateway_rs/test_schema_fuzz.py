"""tests/gateway/test_schema_fuzz.py against the Rust gateway: its own /openapi.json fuzzed with
the same checks and seeded examples, and each case also sent to the Python gateway (the reference,
the same settings, FAKE workers of its own) for the same answer. Here schema-invalid cases too,
on the routes that take a body: the Python file generates schema-valid ones only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from schemathesis import GenerationMode

from embedfleet.common.modeldir import ModelDir
from tests.gateway.test_schema_fuzz import (
    KEY,
    KEYED_OPERATIONS,
    OPERATIONS,
    Case,
    assert_keys_hold,
    fuzz,
    validated,
)

from .conftest import LIMITS, fake_gateways
from .pair import COMPARED_HEADERS, Pair, same

#: routes both gateways serve that the Python file leaves out
MORE = [("POST", "/v1/classify"), ("POST", "/v1/sparse_embeddings"), ("GET", "/metrics")]
#: answers that are each process's own, so equal in status only: /v1/models' `created` (its
#: start time), /metrics' counts
OWN = {"/v1/models", "/metrics"}


def answered_alike(pair: Pair, case: Case, headers: dict[str, str]) -> int:
    """The case checked against the Rust gateway's document and sent as is to the Python gateway
    (not through Pair's httpx, which refuses some header values schemathesis sends, such as
    `Bearer `): asserts the same answer (pair.py's sense); returns its status."""
    rust = validated(case, base_url=pair.rust_url, headers=headers)
    python = case.call(base_url=pair.python_url, headers=headers)
    assert python.request.body == rust.request.body
    assert python.status_code == rust.status_code, (python.content, rust.content)
    if case.path in OWN:
        return rust.status_code
    for name in COMPARED_HEADERS:
        assert python.headers.get(name) == rust.headers.get(name), name
    a, b = orjson.loads(python.content), orjson.loads(rust.content)
    body = rust.request.body
    assert body is None or isinstance(body, bytes | str)
    if body is not None and not is_json(body):
        # each quotes its own parser's account of the fault (orjson's, serde_json's), as
        # test_differential.py's test_bad_json_equal_but_for_the_parser_s_words shows
        a["error"]["message"] = b["error"]["message"] = ""
    same(a, b)
    return rust.status_code


def is_json(body: str | bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def fuzzed_alike(
    pair: Pair, method: str, path: str, mode: GenerationMode = GenerationMode.POSITIVE
) -> list[int]:
    """The statuses of the Python file's number of `mode` cases, each answered alike."""
    seen: list[int] = []
    fuzz(pair.rust_url, method, path, 40, lambda c: seen.append(answered_alike(pair, c, {})), mode)
    assert seen  # examples were generated and answered
    return seen


@pytest.mark.parametrize(("method", "path"), OPERATIONS + MORE)
def test_the_rust_gateway_keeps_the_contract_and_answers_as_python(
    fake_pair: Pair, method: str, path: str
) -> None:
    fuzzed_alike(fake_pair, method, path)


@pytest.mark.parametrize(("method", "path"), [op for op in OPERATIONS + MORE if op[0] == "POST"])
def test_schema_invalid_bodies_are_refused_alike(fake_pair: Pair, method: str, path: str) -> None:
    seen = fuzzed_alike(fake_pair, method, path, GenerationMode.NEGATIVE)
    assert all(400 <= s < 500 for s in seen), seen


@pytest.fixture(scope="module")
def keyed_pair(
    minilm: ModelDir, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Both gateways with the Python file's KEY: their documents declare the bearer scheme."""
    directory = tmp_path_factory.mktemp("schema_fuzz_keys")
    keys = directory / "keys"
    keys.write_text(KEY + "\n")
    settings = {**LIMITS, "api_keys_file": str(keys)}
    with fake_gateways(minilm, settings, directory / "gateway-rs.log") as pair:
        yield pair


@pytest.mark.parametrize(("method", "path"), KEYED_OPERATIONS)
def test_with_keys_the_rust_contract_holds_with_and_without_one(
    keyed_pair: Pair, method: str, path: str
) -> None:
    assert_keys_hold(
        keyed_pair.rust_url,
        method,
        path,
        lambda case, headers: answered_alike(keyed_pair, case, headers),
    )
