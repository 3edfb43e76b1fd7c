"""The cyclic garbage collector's schedule in a long-lived process that answers requests.

CPython's collector walks every tracked object of a generation it collects, with the process
stopped. A full collection comes whenever the old generation has grown by a quarter since the
last one, and a serving process's old generation is mostly what start-up left (modules, the
tokenizer, the model's tables, the app) plus whatever lives a while: under 5,000 slowloris
connections held for their 10 s header bound, the gateway's full collections walked ~100,000
objects and stopped its event loop for 17-51 ms, every few seconds, while its calm p99 was 13 ms.
A test process that imports torch and transformers holds ~240,000: its collections took 300+ ms,
landing on whichever timed request was in flight.

`settle()` freezes what start-up left (it is never walked again) and makes full collections rarer;
young ones stay as frequent and as cheap as CPython's defaults. Garbage that only a full collection
frees (reference cycles that lived long) is freed later, not never. `frozen()` does the freezing
for a bounded timed window only, for a process that goes on to other work (a test's clients).
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: CPython's (700, 10, 10) but for the last: a full collection is considered after 100 young-of-
#: the-old collections rather than 10 (and still needs the quarter's growth)
THRESHOLDS = (700, 10, 100)


def settle() -> None:
    """Call once, from a serving process's own start-up (never from a library or a test
    process): collect what start-up dropped, freeze what it kept."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    # Unfrozen at exit: the interpreter's last collection then sees every object, and extension
    # modules' leak checks (nanobind's, in triton) do not report the frozen ones as leaked.
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)


class _Blocks:
    """frozen() blocks open now: the heap is unfrozen when the last one ends."""

    depth = 0


@contextmanager
def frozen() -> Iterator[None]:
    """What is alive on entry is left out of every collection until the block ends. Blocks may
    overlap (two timed client sets gathered on one event loop): the heap is unfrozen when the last
    ends, so that the process's final collection at exit still sees every object (extension
    modules' leak checks at exit report frozen objects as leaked)."""
    if _Blocks.depth == 0:
        gc.collect()
        gc.freeze()
    _Blocks.depth += 1
    try:
        yield
    finally:
        _Blocks.depth -= 1
        if _Blocks.depth == 0:
            gc.unfreeze()
