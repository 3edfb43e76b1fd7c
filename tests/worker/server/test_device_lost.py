"""A lost device takes the worker out of service (issue 36, finding 6).

A sticky CUDA error (an illegal memory access, a device-side assert) corrupts the process's CUDA
context: every later launch fails the same way. The worker used to stay SERVING and answer
INTERNAL forever; it now stops being ready, answers UNAVAILABLE (the gateway retries elsewhere)
and exits non-zero, so the kubelet restarts it.

MOCK: `StickyEngine` is the null engine whose batches, once armed, raise the error torch raises
for an illegal memory access; there is no GPU here. The worker's own `serve` runs in this test's
event loop with it; the Rust front's runs in a child process (its `serve` holds the process's
signals), with an engine of the same kind armed by a file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir
from embedfleet.testing.polling import wait_for_async
from embedfleet.testing.workers import health_status, worker_stub
from embedfleet.worker import lifecycle
from embedfleet.worker.contract import Pending, WorkItem
from embedfleet.worker.device_errors import device_lost
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.null_engine import NullEngine
from embedfleet.worker.rust_front import Batches
from embedfleet.worker.scheduler import Budget
from embedfleet.worker.settings import WorkerSettings

from .helpers import embed_request, rust_worker_with

ILLEGAL_ACCESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect."
)


def test_sticky_cuda_errors_are_told_from_recoverable_ones() -> None:
    assert device_lost(RuntimeError(ILLEGAL_ACCESS))
    assert device_lost(RuntimeError("CUDA error: device-side assert triggered"))
    assert device_lost(RuntimeError("CUDA error: unspecified launch failure"))
    assert device_lost(RuntimeError("CUDA error: unknown error"))
    outer = ValueError("graph replay failed")
    outer.__cause__ = RuntimeError("CUDA error: misaligned address")
    assert device_lost(outer)  # found through the cause
    # One call fails, the context lives on.
    assert not device_lost(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not device_lost(RuntimeError("CUDA error: invalid argument"))
    assert not device_lost(ValueError("sequence 3 is empty"))
    assert not device_lost(RuntimeError("unknown error in the tokenizer"))  # not CUDA's


def _embed(address: str) -> grpc.StatusCode:
    """One small Embed call's status."""
    with grpc.insecure_channel(address) as channel:
        try:
            worker_stub(channel).Embed(embed_request([[101, 2000, 102]]), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


class StickyEngine(NullEngine):
    armed = False
    steps_after_arming = 0

    def step(self, items: Sequence[WorkItem]) -> Pending:
        if StickyEngine.armed:
            StickyEngine.steps_after_arming += 1
            raise RuntimeError(ILLEGAL_ACCESS)
        return super().step(items)


async def test_a_sticky_cuda_error_stops_serving_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(settings: WorkerSettings, model: ModelDir) -> StickyEngine:
        return StickyEngine.from_model_dir(model)

    registries: list[WorkerMetrics] = []

    class Recorded(WorkerMetrics):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            registries.append(self)

    monkeypatch.setattr(lifecycle, "build_engine", build)
    monkeypatch.setattr(lifecycle, "WorkerMetrics", Recorded)
    port_file = tmp_path / "port.json"
    settings = WorkerSettings(engine="null", port=0, port_file=str(port_file), metrics_port=0)
    serving = asyncio.create_task(lifecycle.serve(settings))
    await wait_for_async("the port file", port_file.is_file, timeout=60)
    address = f"127.0.0.1:{json.loads(port_file.read_text())['port']}"

    async def health() -> str:
        return await asyncio.to_thread(health_status, address, 1.0)

    for _ in range(2400):
        if await health() == "SERVING":
            break
        await asyncio.sleep(0.05)
    ready = registries[0].registry.get_sample_value
    assert ready("embedfleet_worker_ready") == 1

    assert await asyncio.to_thread(_embed, address) == grpc.StatusCode.OK
    StickyEngine.armed = True
    assert await asyncio.to_thread(_embed, address) == grpc.StatusCode.UNAVAILABLE
    after = await health()
    assert after in ("NOT_SERVING", "UNREACHABLE")  # never SERVING again
    assert ready("embedfleet_worker_ready") == 0
    code = await asyncio.wait_for(serving, 30)
    assert code == lifecycle.DEVICE_LOST_EXIT
    # The dead engine was called once: later batches fail without touching the device.
    assert StickyEngine.steps_after_arming == 1


def test_the_rust_fronts_batch_call_reports_a_lost_device_once() -> None:
    model = load_model_dir(default_model_path())
    engine = StickyEngine.from_model_dir(model)
    reported: list[None] = []
    StickyEngine.armed = False
    batches = Batches(
        engine, Budget(512, 16, 1024), model, on_device_lost=lambda: reported.append(None)
    )
    call = ("Embed", embed_request([[101, 2000, 102]]).SerializeToString(), 0.0, None)
    assert isinstance(batches([call])[0], bytes)
    StickyEngine.armed, StickyEngine.steps_after_arming = True, 0
    try:
        first, second = batches([call, call]), batches([call])
    finally:
        StickyEngine.armed = False
    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    assert {reply[0] for reply in first + second} == {unavailable}
    assert "the device is lost: CUDA error: an illegal memory access" in str(second[0][1])
    assert len(reported) == 1
    assert StickyEngine.steps_after_arming == 1  # the second batch never reached the engine


#: the sticky engine for the Rust front's worker: armed when argv[0] exists; each armed step
#: appends a line to argv[1] and raises argv[2]
_STICKY = """
arm, steps, error = argv
class Engine(NullEngine):
    def step(self, items):
        if Path(arm).exists():
            with open(steps, "a") as out:
                out.write("step\\n")
            raise RuntimeError(error)
        return super().step(items)
"""


def test_the_rust_front_stops_serving_and_exits_non_zero(tmp_path: Path) -> None:
    arm, steps = tmp_path / "arm", tmp_path / "steps"
    with rust_worker_with(tmp_path, _STICKY, str(arm), str(steps), ILLEGAL_ACCESS) as worker:
        assert _embed(worker.address) == grpc.StatusCode.OK
        arm.touch()
        assert _embed(worker.address) == grpc.StatusCode.UNAVAILABLE
        # never SERVING again
        assert health_status(worker.address) in ("NOT_SERVING", "UNREACHABLE")
        assert worker.proc.wait(30) == lifecycle.DEVICE_LOST_EXIT
    log_text = worker.log.read_text()
    assert "device lost: not serving; exiting to be restarted" in log_text
    assert "Traceback" not in log_text
    assert steps.read_text().count("step") == 1
