"""heap.settle: what start-up left is frozen out of every later collection; full ones are rarer."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from embedfleet.common import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_freezes_what_is_alive_and_collects_what_is_not(restored_collector: None) -> None:
    gc.unfreeze()
    kept = [_Cycle() for _ in range(100)]
    dropped = [_Cycle() for _ in range(100)]
    witness = weakref.ref(dropped[0])
    del dropped  # unreachable cycles: only a collection frees them
    assert witness() is not None
    heap.settle()
    assert witness() is None  # collected, not frozen
    assert gc.get_threshold() == heap.THRESHOLDS
    assert gc.get_freeze_count() >= len(kept)
    alive = sum(isinstance(o, _Cycle) for o in gc.get_objects())
    assert alive == 0  # the kept ones are frozen: no generation walks them any more
    later = [_Cycle() for _ in range(10)]
    assert sum(isinstance(o, _Cycle) for o in gc.get_objects()) == len(later)


def test_frozen_blocks_unfreeze_when_the_last_one_ends(restored_collector: None) -> None:
    gc.unfreeze()
    kept = _Cycle()
    with heap.frozen():
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())
        with heap.frozen():  # overlapping, as two gathered client sets
            pass
        assert gc.get_freeze_count() > 0  # the outer block still holds
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())  # walked again, collectable again
