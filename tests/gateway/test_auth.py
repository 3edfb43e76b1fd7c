"""API keys: the pure checks, then `embedfleet serve --api-keys-file` as real processes (null-engine
workers) with the keys file laid out as the kubelet lays out a mounted Secret and rotated the way it
rotates one (a new directory, then an atomic rename of the `..data` symlink)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from embedfleet.common.net import free_ports
from embedfleet.gateway.auth import ApiKeys, KeyFile, bearer, key_label, parse_keys
from embedfleet.testing.polling import WaitTimeoutError

from .helpers import wait_until

KEY_A = "sk-embedfleet-alpha-4f1c9e"
KEY_B = "sk-embedfleet-bravo-77d2a0"


def test_parse_keys_skips_blanks_and_comments() -> None:
    assert parse_keys(f"# team a\n {KEY_A} \n\n#{KEY_B}\n{KEY_B}\n") == [KEY_A, KEY_B]


def test_bearer_header() -> None:
    assert bearer(b"Bearer abc") == "abc"
    assert bearer(b"bearer   abc ") == "abc"
    assert bearer(b"Basic abc") is None
    assert bearer(b"Bearer ") is None
    assert bearer(None) is None


def test_check_answers_the_label_of_the_matching_key_only() -> None:
    keys = ApiKeys([KEY_A, KEY_B, KEY_A])
    assert len(keys) == 2
    assert keys.check(KEY_B) == key_label(KEY_B)
    assert keys.check(KEY_A) == hashlib.sha256(KEY_A.encode()).hexdigest()[:12]
    assert keys.check(KEY_A[:-1]) is None
    assert keys.check("") is None
    assert keys.check(None) is None
    assert ApiKeys([]).check(KEY_A) is None


def test_key_file_keeps_its_keys_while_the_file_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEY_A)
    keys = KeyFile(path, 1.0)
    assert keys.keys.check(KEY_A)
    assert not keys.reload()
    path.unlink()
    assert not keys.reload()
    assert keys.keys.check(KEY_A)
    path.write_text(KEY_B)
    assert keys.reload()
    assert keys.keys.check(KEY_B)
    assert not keys.keys.check(KEY_A)


def test_an_unreadable_keys_file_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        KeyFile(tmp_path / "missing", 1.0)


# --- real processes --------------------------------------------------------------------------


class SecretDir:
    """A directory shaped like a mounted Secret: `keys -> ..data/keys`, `..data -> ..<version>`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    @property
    def file(self) -> Path:
        return self.root / "keys"

    def write(self, text: str) -> None:
        self.version += 1
        version = self.root / f"..2026_12_01_{self.version}"
        version.mkdir()
        (version / "keys").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")
        if not self.file.is_symlink():
            self.file.symlink_to("..data/keys")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, SecretDir, Path]]:
    secret = SecretDir(tmp_path / "secret")
    secret.root.mkdir()
    secret.write(f"# rotated by the test\n{KEY_A}\n")
    log = tmp_path / "serve.log"
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "EMBEDFLEET_WORKER_ENGINE": "null",
        "EMBEDFLEET_WORKER_WARMUP_SECONDS": "0.2",
        "EMBEDFLEET_GATEWAY_API_KEY_METRICS": "true",
        "EMBEDFLEET_GATEWAY_API_KEYS_RELOAD_SECONDS": "0.2",
        "EMBEDFLEET_GATEWAY_LOG_LEVEL": "debug",
    }
    script = Path(sys.executable).parent / "embedfleet"
    argv = [str(script), "serve", "--workers", "1", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*argv, "--api-keys-file", str(secret.file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        url = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"embedfleet serve exited: {log.read_text()[-2000:]}")
            return "serving at" in log.read_text()

        try:
            wait_until("serving", serving, timeout=120)
        except WaitTimeoutError as exc:
            raise RuntimeError(f"{exc}; log: {log.read_text()[-2000:]}") from None
        yield url, secret, log
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _post(url: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url + "/v1/embeddings", json={"input": "a b"}, headers=headers, timeout=30)


def _assert_401(reply: httpx.Response) -> None:
    assert reply.status_code == 401, reply.text
    assert reply.headers["www-authenticate"] == "Bearer"
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_api_key"


def test_bearer_keys_rotate_without_restart_and_never_show(
    secured: tuple[str, SecretDir, Path],
) -> None:
    url, secret, log = secured
    _assert_401(_post(url, None))
    _assert_401(_post(url, KEY_B))
    _assert_401(httpx.get(url + "/v1/models", timeout=10))
    assert "didn't provide" in _post(url, None).json()["error"]["message"]
    assert _post(url, KEY_A).status_code == 200
    models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY_A}"})
    assert models.status_code == 200
    # Probes, Prometheus and the schema stay open.
    for path in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert httpx.get(url + path, timeout=10).status_code == 200, path
    schema = httpx.get(url + "/openapi.json", timeout=10).json()
    assert schema["paths"]["/v1/embeddings"]["post"]["security"] == [{"apiKey": []}]

    # Rotation: B replaces A, picked up without a restart.
    secret.write(f"{KEY_B}\n")
    wait_until("the new key", lambda: _post(url, KEY_B).status_code == 200, timeout=20)
    _assert_401(_post(url, KEY_A))

    metrics = httpx.get(url + "/metrics", timeout=10).text
    counts = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'embedfleet_gateway_key_requests_total\{key="(\w+)",route="/v1/embeddings"\} (\S+)',
            metrics,
        )
    }
    assert counts == {key_label(KEY_A): 1.0, key_label(KEY_B): 1.0}, counts
    time.sleep(0.5)  # the gateway's last log lines
    text = log.read_text() + metrics
    assert "api keys reloaded" in text
    for key in (KEY_A, KEY_B):
        assert key not in text
