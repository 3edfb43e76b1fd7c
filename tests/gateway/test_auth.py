"""API keys (--api-keys-file): 401 in OpenAI's shape without a good key, probes and the document
open, the file re-read when it changes (also as the kubelet rotates a mounted Secret, by
re-pointing its `..data` symlink), kept when it vanishes, requests counted per key by digest, and
no key ever in the log or /metrics; a gateway that cannot read its keys does not start."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import LIMITS, Gateway, fake_fleet, run_binary, sample, wait_until

KEYS = "# the team's keys\nkey-one\n\n  key-two  \n"
AUTH = {**LIMITS, "api_key_metrics": True, "api_keys_reload_seconds": 0.1}
BODY = {"input": "a query"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def label(key: str) -> str:
    """A key's label on /metrics: the start of its SHA-256, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    directory = tmp_path_factory.mktemp("keys")
    keys = directory / "api-keys"
    keys.write_text(KEYS)
    settings = {**AUTH, "api_keys_file": keys, "log_level": "debug"}
    with fake_fleet(settings, directory / "gateway.log") as gateway:
        yield gateway, keys


def _status(gateway: Gateway, key: str) -> int:
    return gateway.post("/v1/embeddings", BODY, headers=bearer(key)).status


def test_a_missing_or_wrong_key_is_401(keyed: tuple[Gateway, Path]) -> None:
    gateway, _ = keyed
    for headers in ({}, bearer("key-three"), {"Authorization": "Basic a2V5LW9uZQ=="},
                    {"Authorization": "Bearer"}):  # fmt: skip
        reply = gateway.post("/v1/embeddings", BODY, headers=headers)
        assert reply.status == 401
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.headers["connection"] == "close"  # its body unread: the connection ends
        error = reply.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error", None, "invalid_api_key")  # fmt: skip
        assert b"key-three" not in reply.body
    missing = gateway.post("/v1/embeddings", BODY).json()["error"]["message"]
    assert "didn't provide" in missing
    assert gateway.calls() == []


def test_a_good_key_is_served_any_case_of_the_scheme(keyed: tuple[Gateway, Path]) -> None:
    gateway, _ = keyed
    for key in ("key-one", "key-two"):
        assert (
            len(gateway.ok("/v1/embeddings", {"input": ["a", "b c"]}, headers=bearer(key))["data"])
            == 2
        )
    models = gateway.request("GET", "/v1/models", headers={"authorization": "bearer key-one"})
    assert models.status == 200
    gateway.calls()


def test_probes_metrics_and_the_document_stay_open_and_v1_paths_are_closed(
    keyed: tuple[Gateway, Path],
) -> None:
    gateway, _ = keyed
    for path in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert gateway.request("GET", path).status == 200, path
    doc = gateway.request("GET", "/openapi.json").json()
    assert "securitySchemes" in doc["components"]
    assert doc["paths"]["/v1/embeddings"]["post"]["security"] == [{"apiKey": []}]
    # Before the route: an unknown /v1/ path says nothing without a key, a 404 with one.
    assert gateway.request("GET", "/v1/nope").json()["error"]["code"] == "invalid_api_key"
    assert gateway.request("GET", "/v1/models").status == 401
    nope = gateway.request("GET", "/v1/nope", headers=bearer("key-one"))
    assert (nope.status, nope.json()["error"]["code"]) == (404, "not_found")


def test_requests_are_counted_per_key_by_digest(keyed: tuple[Gateway, Path]) -> None:
    gateway, _ = keyed
    name = "embedfleet_gateway_key_requests_total"
    before = gateway.value(name, key=label("key-two"), route="/v1/embeddings")
    for _ in range(3):
        assert _status(gateway, "key-two") == 200
    text = gateway.metrics()
    assert sample(text, name, key=label("key-two"), route="/v1/embeddings") == before + 3
    assert "key-two" not in text
    assert "key-one" not in text
    gateway.calls()


def test_a_changed_file_is_reloaded_and_a_vanished_one_keeps_its_keys(
    keyed: tuple[Gateway, Path],
) -> None:
    gateway, keys = keyed
    try:
        keys.write_text("key-rotated\n")
        wait_until("the new key accepted", lambda: _status(gateway, "key-rotated") == 200)
        assert _status(gateway, "key-one") == 401
        keys.unlink()
        # Over several reload intervals with no file (0.1 s each), the last keys hold.
        for _ in range(5):
            assert (_status(gateway, "key-rotated"), _status(gateway, "key-one")) == (200, 401)
            time.sleep(0.1)
    finally:
        keys.write_text(KEYS)
    wait_until("the keys restored", lambda: _status(gateway, "key-one") == 200)
    text = gateway.log.read_text()
    assert "api keys reloaded" in text
    for key in ("key-one", "key-two", "key-rotated"):
        assert key not in text
    gateway.calls()


class SecretDir:
    """A directory shaped like a mounted Secret: `keys -> ..data/keys`, `..data -> ..<version>`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir()

    @property
    def file(self) -> Path:
        return self.root / "keys"

    def write(self, text: str) -> None:
        """A new version directory, then an atomic rename of `..data`, as the kubelet does."""
        self.version += 1
        version = self.root / f"..2026_12_01_{self.version}"
        version.mkdir()
        (version / "keys").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")
        if not self.file.is_symlink():
            self.file.symlink_to("..data/keys")


def test_a_secret_rotated_by_its_data_symlink_swaps_the_keys(tmp_path: Path) -> None:
    secret = SecretDir(tmp_path / "secret")
    secret.write("# rotated by the test\nsk-embedfleet-alpha-4f1c9e\n")
    settings = {**AUTH, "api_keys_file": secret.file, "log_level": "debug"}
    with fake_fleet(settings, tmp_path / "gateway.log") as gateway:
        assert _status(gateway, "sk-embedfleet-alpha-4f1c9e") == 200
        assert _status(gateway, "sk-embedfleet-bravo-77d2a0") == 401
        old = (secret.root / "..data").resolve()
        secret.write("sk-embedfleet-bravo-77d2a0\n")
        shutil.rmtree(old)  # as the kubelet does after the swap
        wait_until("the new key", lambda: _status(gateway, "sk-embedfleet-bravo-77d2a0") == 200)
        assert _status(gateway, "sk-embedfleet-alpha-4f1c9e") == 401
        metrics = gateway.metrics()
    text = gateway.log.read_text() + metrics
    assert "api keys reloaded" in text
    for key in ("sk-embedfleet-alpha-4f1c9e", "sk-embedfleet-bravo-77d2a0"):
        assert key not in text


def test_an_unreadable_keys_file_refuses_to_start(tmp_path: Path) -> None:
    """A gateway that should check keys must not start open."""
    done = run_binary("--workers", "127.0.0.1:1", "--api-keys-file", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "--api-keys-file" in done.stderr
