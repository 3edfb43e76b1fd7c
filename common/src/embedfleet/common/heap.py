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
frees (reference cycles that lived long) is freed later, not never.
"""

from __future__ import annotations

import gc

#: CPython's (700, 10, 10) but for the last: a full collection is considered after 100 young-of-
#: the-old collections rather than 10 (and still needs the quarter's growth)
THRESHOLDS = (700, 10, 100)


def settle() -> None:
    """Call once start-up is done: collect what start-up dropped, freeze what it kept."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
