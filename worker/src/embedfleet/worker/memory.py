"""Bounding a worker's memory under traffic of varying shapes (docs/worker.md, "Memory").

Measured causes of RSS growing with every new batch shape (the total token count) on a CPU:

- two per-shape caches of torch's bf16 matmul path, oneDNN's primitive cache and ideep's
  computation cache, hold 1024 entries each by default at ~0.3 MB per MiniLM entry (~640 MB when
  full). They read their capacity from the environment at first use, so `cache_environment` sets
  it before torch is imported.
- glibc keeps freed tensor buffers in its heap arenas (its dynamic mmap threshold grows to 32 MiB
  after the first large free): buffers of ever-changing sizes leave hundreds of MB free but held.
  `Trimmer` hands those pages back (malloc_trim) at most once per interval, from the engine thread
  after a batch. (Fixing the mmap threshold instead bounds it too, but costs a page fault per
  4 KiB of every large tensor: +26% CPU per batch, measured.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: the environment variables that size the per-shape caches of torch's oneDNN (mkldnn) path
CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def cache_environment(
    capacity: int, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set (and return) the cache-capacity variables; 0 leaves the libraries' defaults."""
    environ = os.environ if environ is None else environ
    if capacity <= 0:
        return {}
    values = dict.fromkeys(CACHE_ENV, str(capacity))
    environ.update(values)
    return values


def bound_caches(capacity: int) -> None:
    """At process start, before anything imports torch."""
    if "torch" in sys.modules:
        # The caches read their capacity once; set too late, the defaults stay.
        log.warning("library cache capacity set after torch was imported: it may not apply")
    set_to = cache_environment(capacity)
    log.info("library caches", extra={"capacity": capacity if set_to else "library default"})


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is None:
        return None
    return lambda: trim(0)


@dataclass
class Trimmer:
    """Decides when the engine thread trims the heap: at most once per `seconds` (0: never)."""

    seconds: float
    trim: Callable[[], object] | None = None
    _last: float = 0.0

    @classmethod
    def for_process(cls, seconds: float) -> Trimmer:
        trim = _malloc_trim() if seconds > 0 else None
        if seconds > 0 and trim is None:
            log.warning("no malloc_trim in this C library: freed heap pages stay held")
        return cls(seconds, trim)

    def due(self, now: float) -> bool:
        return self.trim is not None and self.seconds > 0 and now - self._last >= self.seconds

    def maybe_trim(self, now: float) -> bool:
        """Trim if due; True when it did."""
        if not self.due(now):
            return False
        assert self.trim is not None
        self.trim()
        self._last = now
        return True
