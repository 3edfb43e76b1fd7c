"""What benchmarks read from /proc: the parsers on fixed texts, the readers on real processes."""

from __future__ import annotations

import os
import subprocess
import sys

from embedfleet.testing import procfs


def test_status_fields_are_read_in_kib_and_absent_ones_are_none() -> None:
    text = "Name:\tpython3\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n"
    assert procfs.status_kib(text, "VmHWM") == 204800
    assert procfs.status_kib(text, "VmRSS") == 102400
    assert procfs.status_kib("Name:\tkthreadd\nState:\tS (sleeping)\n", "VmRSS") is None


def test_stat_fields_start_after_a_command_name_with_spaces_and_parentheses() -> None:
    text = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 1 0 0 0 250 30 0 0 20 0 1 0 9"
    fields = procfs.stat_fields(text)
    assert fields[0] == "S"
    assert fields[1] == "17"
    assert (fields[11], fields[12]) == ("250", "30")


def test_a_tree_is_its_root_and_everything_below_it_and_nothing_else() -> None:
    parents = {10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert sorted(procfs.descendants(parents, 10)) == [10, 11, 12, 13]
    assert procfs.descendants(parents, 13) == [13]
    assert procfs.descendants(parents, 99) == [99]


def test_a_trees_peak_memory_counts_a_childs_peak_after_it_freed_it() -> None:
    # the child touches 300 MiB, frees it, and waits: its VmHWM keeps the peak, its VmRSS drops
    script = (
        "import sys\n"
        "block = bytearray(300 * 1024 * 1024)\n"
        "block[::4096] = b'x' * len(block[::4096])\n"
        "del block\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        own = procfs.tree_peak_rss_mb(child.pid)
        ours = procfs.tree_peak_rss_mb(os.getpid())
        now = procfs.rss_mb(child.pid)
        assert own is not None
        assert ours is not None
        assert now is not None
        assert own > 300 > now
        assert ours >= own + (procfs.rss_mb(os.getpid()) or 0.0) - 1
        cpu = procfs.cpu_seconds(child.pid)
        assert cpu is not None
        assert procfs.tree_cpu_seconds(os.getpid()) >= cpu
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    assert procfs.tree_peak_rss_mb(child.pid) is None
    assert procfs.rss_mb(child.pid) is None
    assert procfs.cpu_seconds(child.pid) is None
