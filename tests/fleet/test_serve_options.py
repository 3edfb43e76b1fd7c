"""`embedfleet serve`'s own options: several models behind one gateway, each on workers of its
own and routed by the request's `model`; API keys passed to the gateway; where the gateway binary
is found; the one line said when it is not, or a model directory is missing or refused, or the
port is taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.modeldir import default_model_path
from embedfleet.common.net import free_ports
from embedfleet.fleet import binary
from embedfleet.fleet.supervisor import served_model

from .helpers import children, kill, serve, url_of


def test_served_model_reads_name_equals_path() -> None:
    assert served_model("a=/m/x") == ("a", "/m/x")
    assert served_model("/m/x") == ("", "/m/x")
    assert served_model("/m/a=b") == ("", "/m/a=b")


def _requests(text: str, model: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "embedfleet_gateway_requests_total" and s.labels == {
                "route": "/v1/embeddings", "code": "200", "model": model}:  # fmt: skip
                return float(s.value)
    return 0.0


def test_serve_routes_each_model_to_its_own_workers() -> None:
    (port,) = free_ports(1)
    path = str(default_model_path())
    proc = serve(port, "--model", f"alpha={path}", "--model", f"beta={path}", workers=1)
    try:
        url = url_of(proc)
        assert len(children(proc.pid)) == 3  # a worker per model and the gateway
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
        for model in ("alpha", "beta", "beta"):
            reply = httpx.post(
                url + "/v1/embeddings", json={"model": model, "input": ["a", "b c"]}, timeout=30
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == model
        text = httpx.get(url + "/metrics", timeout=10).text
        assert (_requests(text, "alpha"), _requests(text, "beta")) == (1, 2)
        unknown = httpx.post(url + "/v1/embeddings", json={"model": "gamma", "input": "a"})
        assert unknown.status_code == 404
        assert "'alpha', 'beta'" in unknown.json()["error"]["message"]
    finally:
        kill(proc)


def test_serve_passes_its_api_keys_to_the_gateway(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-serve-0123\n")
    (port,) = free_ports(1)
    proc = serve(port, "--api-keys-file", str(keys), workers=1)
    try:
        url = url_of(proc)
        assert httpx.post(url + "/v1/embeddings", json={"input": "a"}).status_code == 401
        keyed = {"Authorization": "Bearer sk-serve-0123"}
        assert (
            httpx.post(url + "/v1/embeddings", json={"input": "a"}, headers=keyed).status_code
            == 200
        )
    finally:
        kill(proc)


def _serve_once(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "embedfleet"
    return subprocess.run(
        [str(script), "serve", "--workers", "1", "--port", str(free_ports(1)[0]), *argv],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_missing_keys_file_model_or_gateway_binary_or_a_taken_port_is_one_line(
    tmp_path: Path,
) -> None:
    env = {**os.environ, binary.BINARY_ENV: ""}
    done = _serve_once("--api-keys-file", str(tmp_path / "missing"), env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"--api-keys-file {tmp_path / 'missing'}: no such file"
    ]
    done = _serve_once("--gateway-binary", str(tmp_path / "nothing"), env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"embedfleet serve: the gateway binary {tmp_path / 'nothing'} is not an executable file"
    ]
    done = _serve_once("--model", f"mini={tmp_path / 'nowhere'}", env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"--model {tmp_path / 'nowhere'}: no such directory (a model directory, or NAME=DIR)"
    ]
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text('{"model_type": "t5", "architectures": ["T5EncoderModel"]}')
    done = _serve_once("--model", str(t5), env=env)
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()  # the worker's refusal, before any child starts
    assert line.startswith("embedfleet serve: unsupported model: model_type 't5'")
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _serve_once("--port", str(port), env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"embedfleet serve: port {port} is in use; stop what holds it or choose another with --port"
    ]


def test_a_start_that_outlasts_its_timeout_is_one_line() -> None:
    done = _serve_once("--start-timeout", "0.2", env=dict(os.environ))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "embedfleet serve: the fleet was not ready within 0.2s; a large model on a CPU may need "
        "a longer --start-timeout"
    )


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_binary_is_found_by_setting_then_path_then_the_build_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = _executable(tmp_path / "named")
    on_path = tmp_path / "bin"
    on_path.mkdir()
    _executable(on_path / binary.BINARY)
    cached = _executable(tmp_path / "cached")
    script = tmp_path / "build.sh"
    script.write_text(f"echo building nothing >&2\necho {cached}\n")
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    assert binary.find_gateway_binary(str(named), {}, script) == named
    assert binary.find_gateway_binary("", {binary.BINARY_ENV: str(named)}, script) == named
    assert binary.find_gateway_binary("", {}, script) == on_path / binary.BINARY
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert binary.find_gateway_binary("", {}, script) == cached
    cached.unlink()
    with pytest.raises(binary.UnbuiltError, match=r"is not built: run `make install`"):
        binary.find_gateway_binary("", {}, script)


def test_the_rust_front_is_found_by_env_then_the_installed_module_then_the_build_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "named.so"
    named.write_bytes(b"")
    cached = tmp_path / "cached.so"
    cached.write_bytes(b"")
    script = tmp_path / "build-rust.sh"
    script.write_text(f'[ "$1 $2" = "worker-front --key" ] && echo {cached}\n')
    env = {binary.FRONT_LIBRARY_ENV: str(named)}
    assert binary.find_front_library(env, script) == str(named)
    with pytest.raises(binary.UnbuiltError, match="is not a file"):
        binary.find_front_library({binary.FRONT_LIBRARY_ENV: str(tmp_path / "gone.so")}, script)
    assert binary.find_front_library({}, script) == str(cached)
    installed = tmp_path / "site"
    installed.mkdir()
    (installed / f"{binary.FRONT_MODULE}.py").write_text("")
    monkeypatch.syspath_prepend(str(installed))
    assert binary.find_front_library({}, script) == ""  # the worker imports it itself
    monkeypatch.undo()
    cached.unlink()
    with pytest.raises(binary.UnbuiltError, match=r"not built: run `make install`.*python"):
        binary.find_front_library({}, script)
