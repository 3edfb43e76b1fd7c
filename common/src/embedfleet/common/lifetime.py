"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with(parent: int, sig: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn asking the kernel to send `sig` to the child when the thread that forked it
    dies, so a parent killed outright (SIGKILL, an OOM kill, a test timeout) leaves no children
    behind. Fork from a thread that lives as long as the children should. The prctl is resolved
    before the fork; the child only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return arm
