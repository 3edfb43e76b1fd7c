"""API keys in the Rust gateway, against the Python gateway reading the same keys file: the same
401s (missing, wrong, stale key), the same open routes, the same answers with a good key, the
same reload when the file changes (also as the kubelet rotates a mounted Secret, by re-pointing
its `..data` symlink), and per-key counters labelled by digest, never the key."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.auth import key_label
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.gateway_rs import running_gateway_rs
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import GatewayThread, wait_until
from tests.gateway.test_auth import KEY_A, KEY_B, SecretDir

from .conftest import LIMITS, fake_gateways, flags, run_binary
from .pair import STALE, Pair

KEYS = "# the team's keys\nkey-one\n\n  key-two  \n"
AUTH = {"api_key_metrics": True, "api_keys_reload_seconds": 0.1}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(KEYS)
    return path


@pytest.fixture(scope="module")
def keyed_pair(minilm: ModelDir, rust_binary: Path, keys_file: Path) -> Iterator[Pair]:
    """Both gateways reading one keys file, each in front of its own fake worker."""
    py_worker, rs_worker = FakeWorker(0).start(), FakeWorker(0).start()
    settings = {**LIMITS, **AUTH, "api_keys_file": str(keys_file)}
    python = GatewayThread(
        GatewaySettings(workers=(py_worker.address,), **settings),  # type: ignore[arg-type]
        minilm,
    ).start()
    try:
        log = keys_file.parent / "gateway-rs.log"
        with running_gateway_rs([rs_worker.address], *flags(settings), log=log) as rs:
            wait_until("python worker ready", lambda: len(python.app.balancer.usable()) == 1)
            pair = Pair(python.url, rs.url, [py_worker], [rs_worker])
            yield pair
            pair.close()
    finally:
        python.stop()
        py_worker.stop()
        rs_worker.stop()


def test_a_missing_or_wrong_key_is_401_alike(keyed_pair: Pair) -> None:
    body = orjson.dumps({"input": "a query"})
    for headers in ({}, bearer("key-three"), {"Authorization": "Basic a2V5LW9uZQ=="}):
        error = keyed_pair.compare("POST", "/v1/embeddings", content=body, headers=headers)
        assert error["error"]["code"] == "invalid_api_key"
        py, rs = keyed_pair.both("POST", "/v1/embeddings", content=body, headers=headers)
        assert py.status == rs.status == 401
        assert py.headers["www-authenticate"] == rs.headers["www-authenticate"] == "Bearer"
        assert b"key-three" not in rs.body


def test_a_good_key_is_served_alike(keyed_pair: Pair) -> None:
    for key in ("key-one", "key-two"):
        doc = keyed_pair.embed({"input": ["a", "b c"]}, headers=bearer(key))
        assert len(doc["data"]) == 2
    assert keyed_pair.models(headers={"authorization": "bearer key-one"})["data"]


def test_probes_and_metrics_stay_open_and_v1_paths_are_closed(keyed_pair: Pair) -> None:
    for path in ("/health", "/ready", "/metrics"):
        py, rs = keyed_pair.both("GET", path)
        assert py.status == rs.status == 200, path
    # Before the route: an unknown /v1/ path says nothing without a key, a 404 with one.
    assert keyed_pair.compare("GET", "/v1/nope")["error"]["code"] == "invalid_api_key"
    assert keyed_pair.compare("GET", "/v1/models")["error"]["code"] == "invalid_api_key"
    assert keyed_pair.compare("GET", "/v1/nope", headers=bearer("key-one"))["error"]["code"] == (
        "not_found"
    )


def test_the_document_declares_the_key_alike(keyed_pair: Pair) -> None:
    py, rs = keyed_pair.both("GET", "/openapi.json")
    assert py.status == rs.status == 200
    assert py.body == rs.body, STALE
    assert "securitySchemes" in py.json()["components"]


def test_key_requests_are_counted_by_digest_never_by_key(keyed_pair: Pair) -> None:
    def count(text: str) -> float:
        label = key_label("key-two")
        series = f'embedfleet_gateway_key_requests_total{{key="{label}",route="/v1/embeddings"}}'
        lines = [line for line in text.splitlines() if line.startswith(series)]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

    before = count(keyed_pair.rust().request("GET", "/metrics").body.decode())
    for _ in range(3):
        keyed_pair.embed({"input": "q"}, headers=bearer("key-two"))
    text = keyed_pair.rust().request("GET", "/metrics").body.decode()
    assert count(text) == before + 3
    assert "key-two" not in text
    assert "key-one" not in text


def test_a_changed_file_is_reloaded_and_a_vanished_one_keeps_its_keys(
    keyed_pair: Pair, keys_file: Path
) -> None:
    body = orjson.dumps({"input": "q"})

    def status(key: str) -> tuple[int, int]:
        py, rs = keyed_pair.both("POST", "/v1/embeddings", content=body, headers=bearer(key))
        return py.status, rs.status

    try:
        keys_file.write_text("key-rotated\n")
        wait_until("the new key accepted", lambda: status("key-rotated") == (200, 200))
        assert status("key-one") == (401, 401)
        keys_file.unlink()
        # Over several reload intervals with no file (0.1 s each), the last keys hold.
        for _ in range(5):
            assert status("key-rotated") == (200, 200)
            assert status("key-one") == (401, 401)
            time.sleep(0.1)
    finally:
        keys_file.write_text(KEYS)
    wait_until("the keys restored", lambda: status("key-one") == (200, 200))


def test_a_secret_rotated_by_its_data_symlink_swaps_the_keys_and_never_shows_them(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the Python gateway's records, from its thread
    secret = SecretDir(tmp_path / "secret")
    secret.root.mkdir()
    secret.write(f"# rotated by the test\n{KEY_A}\n")
    # debug: every line either gateway could log is one the keys must stay out of
    settings = {**LIMITS, **AUTH, "api_keys_file": str(secret.file), "log_level": "debug"}
    log = tmp_path / "gateway-rs.log"
    body = orjson.dumps({"input": "q"})
    with fake_gateways(minilm, settings, log) as pair:

        def status(key: str) -> tuple[int, int]:
            py, rs = pair.both("POST", "/v1/embeddings", content=body, headers=bearer(key))
            return py.status, rs.status

        assert status(KEY_A) == (200, 200)
        assert status(KEY_B) == (401, 401)
        old = (secret.root / "..data").resolve()
        secret.write(f"{KEY_B}\n")
        # as the kubelet does after the swap: a gateway holding the old target finds nothing
        shutil.rmtree(old)
        wait_until("the new key accepted", lambda: status(KEY_B) == (200, 200))
        error = pair.compare("POST", "/v1/embeddings", content=body, headers=bearer(KEY_A))
        assert error["error"]["code"] == "invalid_api_key"
        metrics = pair.rust().request("GET", "/metrics").body.decode()
    text = log.read_text()
    assert "api keys reloaded" in text
    assert "api keys reloaded" in caplog.messages
    records = " ".join(str(r.__dict__) for r in caplog.records)
    for key in (KEY_A, KEY_B):
        assert key not in text + metrics + records


def test_an_unreadable_keys_file_refuses_to_start(rust_binary: Path, tmp_path: Path) -> None:
    """A gateway that should check keys must not start open."""
    missing = str(tmp_path / "missing")
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", "--api-keys-file", missing)
    assert proc.returncode == 2
    assert "--api-keys-file" in proc.stderr
