"""Which real-node slots are taken on this machine, recorded so that a killed run's leftovers
are found and removed by the next one (never by guessing: every name derives from the slot and
its run, six hex digits new for every claim).

$EMBEDFLEET_NODE_ROOT (default /var/lib/embedfleet/nodes) holds <index>.json per slot in use and
<index>-<run>/, the node's directory. The record is written before anything is created and
removed after everything is gone. A slot is live while its owner (the process that claimed it)
or any recorded component runs; otherwise it is stale and reclaimed under the same lock.

A few host paths are fixed by the components themselves (kubelet's device-plugin socket dir,
libcni's cache dir) and shared by every node. host.json records the ones that did not exist
before a node here made them; they are removed with the last slot.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from embedfleet.testing.nodeconfig import MAX_SLOTS, NodeSlot
from embedfleet.testing.process import ProcessRecord, is_running, start_ticks

ROOT_ENV = "EMBEDFLEET_NODE_ROOT"
DEFAULT_ROOT = Path("/var/lib/embedfleet/nodes")
# containerd refuses a shim socket dir longer than 42 characters; ours is <root>/<index>-<run>/s.
MAX_ROOT_LENGTH = 42 - len("/31-abcdef/s")

State = dict[str, Any]


class SlotError(RuntimeError):
    """No slot is free, or a stale one could not be cleaned."""


def node_root() -> Path:
    root = Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    if len(str(root)) > MAX_ROOT_LENGTH:
        raise SlotError(f"{ROOT_ENV}={root} is longer than {MAX_ROOT_LENGTH} characters")
    return root


def state_path(root: Path, index: int) -> Path:
    return root / f"{index}.json"


def read(root: Path, index: int) -> State | None:
    try:
        state: State = json.loads(state_path(root, index).read_text())
    except FileNotFoundError:
        return None
    return state


def write(root: Path, state: State) -> None:
    path = state_path(root, int(state["index"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def records(state: State) -> list[ProcessRecord]:
    return [ProcessRecord.from_json(item) for item in state.get("processes", [])]


def is_live(state: State) -> bool:
    owner = ProcessRecord.from_json(state["owner"])
    return is_running(owner) or any(is_running(record) for record in records(state))


def owner_record() -> dict[str, Any]:
    pid = os.getpid()
    ticks = start_ticks(pid)
    assert ticks is not None  # this process is alive
    return ProcessRecord("owner", pid, ticks, Path("/dev/null")).to_json()


@contextmanager
def locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _host_record(root: Path) -> Path:
    return root / "host.json"


def _note_shared(root: Path, paths: Sequence[Path]) -> None:
    """Records which of the shared host paths a node is about to create."""
    record = _host_record(root)
    created = set(json.loads(record.read_text())["created"]) if record.exists() else set()
    created.update(str(path) for path in paths if not path.exists())
    record.write_text(json.dumps({"created": sorted(created)}) + "\n")


def _drop_shared(root: Path) -> None:
    """With no slot left, removes the shared host paths that nodes here created."""
    record = _host_record(root)
    if not record.exists() or any(read(root, i) is not None for i in range(MAX_SLOTS)):
        return
    for path in json.loads(record.read_text())["created"]:
        shutil.rmtree(path, ignore_errors=True)
    record.unlink()


def reclaim_stale(root: Path, undo: Callable[[State], None]) -> list[int]:
    """Undoes every stale slot (call under `locked`); returns their indexes. A slot that cannot
    be undone keeps its record, so it stays taken (and named) rather than reused half-clean."""
    reclaimed = []
    for index in range(MAX_SLOTS):
        state = read(root, index)
        if state is None or is_live(state):
            continue
        try:
            undo(state)
        except Exception as err:  # any failure: keep the slot, say why
            print(f"nodeslots: cannot reclaim {state_path(root, index)}: {err!r}", file=sys.stderr)
            continue
        state_path(root, index).unlink()
        reclaimed.append(index)
    _drop_shared(root)
    return reclaimed


def claim(root: Path, undo: Callable[[State], None], shared_paths: Sequence[Path] = ()) -> State:
    """Reclaims stale slots, then records and returns the lowest free one."""
    with locked(root):
        reclaim_stale(root, undo)
        _note_shared(root, shared_paths)
        for index in range(MAX_SLOTS):
            if read(root, index) is None:
                slot = NodeSlot(index, secrets.token_hex(3))
                state: State = {
                    "index": index,
                    "run": slot.run,
                    "name": slot.name,
                    "dir": str(root / f"{index}-{slot.run}"),
                    "owner": owner_record(),
                    "processes": [],
                }
                write(root, state)
                return state
    raise SlotError(f"all {MAX_SLOTS} real-node slots under {root} are in use")


def release(root: Path, state: State, undo: Callable[[State], None]) -> None:
    with locked(root):
        undo(state)
        state_path(root, int(state["index"])).unlink(missing_ok=True)
        _drop_shared(root)
