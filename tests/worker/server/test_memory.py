"""The memory bounds' decisions (worker/memory.py), without a process: which variables are set,
and when the heap is trimmed. test_memory_growth.py measures their effect on a real worker."""

from __future__ import annotations

from embedfleet.worker.memory import CACHE_ENV, Trimmer, cache_environment


def test_cache_capacity_sets_both_libraries_variables() -> None:
    environ: dict[str, str] = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
    assert cache_environment(64, environ) == dict.fromkeys(CACHE_ENV, "64")
    assert environ == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def test_zero_capacity_leaves_the_environment_alone() -> None:
    environ = {"LRU_CACHE_CAPACITY": "7"}
    assert cache_environment(0, environ) == {}
    assert environ == {"LRU_CACHE_CAPACITY": "7"}


def test_trims_at_most_once_per_interval() -> None:
    calls: list[int] = []
    trimmer = Trimmer(10.0, lambda: calls.append(1))
    done = [trimmer.maybe_trim(t) for t in (100.0, 101.0, 109.9, 110.0, 115.0, 120.5)]
    assert done == [True, False, False, True, False, True]
    assert len(calls) == 3


def test_zero_seconds_never_trims() -> None:
    calls: list[int] = []
    trimmer = Trimmer(0.0, lambda: calls.append(1))
    assert not any(trimmer.maybe_trim(t) for t in (0.0, 100.0, 1e6))
    assert calls == []


def test_this_process_has_a_trim_when_glibc() -> None:
    import platform

    trimmer = Trimmer.for_process(1.0)
    if platform.libc_ver()[0] == "glibc":
        assert trimmer.trim is not None
        assert trimmer.maybe_trim(1e9)
