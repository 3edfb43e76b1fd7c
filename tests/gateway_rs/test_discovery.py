"""A watched --workers-file: both gateways follow it alike as workers are added and removed
live, each in front of its own FAKE workers numbered alike (a row's fourth value names the
worker that computed it); and what each does with a line that is not an address and with a
file it cannot read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .conftest import LIMITS, flags
from .pair import Pair, gateways

#: small chunks, so that 40 inputs spread over every worker there is
SPREAD = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1}
INPUTS = [f"text number {i}" for i in range(40)]


@pytest.fixture
def listed(minilm: ModelDir, tmp_path: Path) -> Iterator[tuple[Pair, Path, Path]]:
    """Both gateways reading a workers file each, empty at first (a comment)."""
    files = [tmp_path / "python-workers", tmp_path / "rust-workers"]
    for f in files:
        f.write_text("# no workers yet\n")
    py_workers = [FakeWorker(n).start() for n in range(2)]
    rs_workers = [FakeWorker(n).start() for n in range(2)]
    settings = GatewaySettings(workers_file=str(files[0]), **SPREAD)  # type: ignore[arg-type]
    rust = ["--workers-file", str(files[1]), *flags(SPREAD)]
    log = tmp_path / "gateway-rs.log"
    try:
        with gateways(minilm, settings, rust, log, (py_workers, rs_workers), False) as pair:
            yield pair, files[0], files[1]
    finally:
        for w in py_workers + rs_workers:
            w.stop()


def _list(pair: Pair, files: tuple[Path, Path], numbers: list[int]) -> None:
    """Both files name the workers `numbers` (each gateway's own fakes of those numbers)."""
    for path, workers in zip(files, (pair.python_workers, pair.rust_workers), strict=True):
        lines = [f"{workers[n].address}  # worker {n}" for n in numbers]
        path.write_text("# listed by the test\n" + "\n".join(lines) + "\n")


def test_workers_are_added_and_removed_as_the_file_changes(
    listed: tuple[Pair, Path, Path],
) -> None:
    pair, *paths = listed
    files = (paths[0], paths[1])
    # No worker listed: not ready, and a request is the same 503.
    assert [one.request("GET", "/ready").status for one in (pair.python(), pair.rust())] == [
        503,
        503,
    ]
    doc = pair.embed({"input": "x"})
    assert doc["error"]["code"] == "no_workers"

    _list(pair, files, [0])
    wait_until("one worker each", lambda: pair.worker_counts() == [(1, 1), (1, 1)])
    assert pair.served_by(INPUTS) == [{0}, {0}]

    _list(pair, files, [0, 1])
    wait_until("two workers each", lambda: pair.worker_counts() == [(2, 2), (2, 2)])
    assert pair.served_by(INPUTS) == [{0, 1}, {0, 1}]

    _list(pair, files, [1])  # worker 0 removed: nothing goes there any more
    wait_until("worker 0 gone", lambda: pair.worker_counts() == [(1, 1), (1, 1)])
    before = [len(ws[0].calls) for ws in (pair.python_workers, pair.rust_workers)]
    assert pair.served_by(INPUTS) == [{1}, {1}]
    assert [len(ws[0].calls) for ws in (pair.python_workers, pair.rust_workers)] == before

    for f in files:  # the file gone: only the static list is left, here none
        f.unlink()
    wait_until("no workers", lambda: pair.worker_counts() == [(0, 0), (0, 0)])
    doc = pair.embed({"input": "x"})
    assert doc["error"]["code"] == "no_workers"
    # Each change logged as the Python gateway logs it (gateway/pool.py): addresses, sorted.
    addresses = [w.address for w in pair.rust_workers]
    changes = [
        (r["added"], r["removed"])
        for r in map(json.loads, (paths[0].parent / "gateway-rs.log").read_text().splitlines())
        if r["msg"] == "workers changed"
    ]
    assert changes == [
        ([addresses[0]], []),
        ([addresses[1]], []),
        ([], [addresses[0]]),
        ([], [addresses[1]]),
    ]


def _write(pair: Pair, files: tuple[Path, Path], lines: list[str | int]) -> None:
    """Both files list `lines`: a number is that gateway's own fake of that number."""
    for path, workers in zip(files, (pair.python_workers, pair.rust_workers), strict=True):
        text = [workers[x].address if isinstance(x, int) else x for x in lines]
        path.write_text("\n".join(text) + "\n")


def _ready_counts(pair: Pair) -> list[float]:
    return [ready for ready, _ in pair.worker_counts()]


def test_a_line_that_is_not_an_address_is_logged_and_the_others_used(
    listed: tuple[Pair, Path, Path], tmp_path: Path
) -> None:
    pair, py_file, rs_file = listed
    log = tmp_path / "gateway-rs.log"  # the fixture's
    _write(pair, (py_file, rs_file), ["not an address", 0])
    wait_until("worker 0 ready", lambda: _ready_counts(pair) == [1, 1])
    assert pair.served_by([f"text {i}" for i in range(8)]) == [{0}, {0}]
    # Both leave the line out, saying so.
    assert pair.worker_counts() == [(1, 1)] * 2
    skipped = [line for line in log.read_text().splitlines() if "worker address skipped" in line]
    assert len(skipped) == 1, skipped
    assert "not an address" in skipped[0]


def test_an_unreadable_workers_file_keeps_the_last_set(
    listed: tuple[Pair, Path, Path], tmp_path: Path
) -> None:
    pair, py_file, rs_file = listed
    log = tmp_path / "gateway-rs.log"  # the fixture's
    _write(pair, (py_file, rs_file), [0])
    wait_until("worker 0 ready", lambda: pair.worker_counts() == [(1, 1)] * 2)
    for f in (py_file, rs_file):
        f.write_bytes(b"\xff\xfe not UTF-8 \x80\n")
    wait_until("the Rust gateway saw it", lambda: "workers file unreadable" in log.read_text())
    time.sleep(1.0)  # two polls of the Python gateway's watch too
    assert pair.worker_counts() == [(1, 1)] * 2
    assert pair.served_by(["a", "b"]) == [{0}, {0}]
    assert log.read_text().count("workers file unreadable") == 1  # said once, not each poll
    # Readable again: both follow it.
    _write(pair, (py_file, rs_file), [1])

    def moved() -> bool:
        try:
            return pair.served_by(["a"]) == [{1}, {1}]
        except AssertionError:  # worker 1 not yet ready (a 503): not yet
            return False

    wait_until("worker 1 alone", moved)
