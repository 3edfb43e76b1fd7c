"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Sequence


def dying_with_parent(argv: Sequence[str], sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """`argv` run so that the kernel sends it `sig` when the thread that started it dies, so a
    parent killed outright (SIGKILL, an OOM kill, a test timeout) leaves no children behind.
    Start it from a thread that lives as long as the children should.

    util-linux's setpriv sets the parent-death signal and execs `argv` (same pid; the signal
    survives the exec). Not a preexec_fn: one makes subprocess fork() instead of vfork(), and a
    fork runs the atfork handlers of every library loaded here. gRPC's handlers restart its event
    poller in the child, whose epoll descriptor close_fds then closes: the child
    aborted (SIGABRT) before its exec, 16 of 300 spawns from a process with a gRPC channel open.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise FileNotFoundError(
            "setpriv not found: install util-linux (apt-get install util-linux)"
        )
    name = sig.name.removeprefix("SIG")
    # A parent that died before setpriv set the signal never sends it: the shell, started
    # after, finds itself adopted and signals itself instead.
    check = f'[ "$PPID" = {os.getpid()} ] || kill -{name} $$; exec "$@"'
    return [setpriv, f"--pdeathsig={name}", "--", "/bin/sh", "-c", check, "sh", *argv]
