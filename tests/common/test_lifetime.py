"""Children started to die with their parent (common/lifetime.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc

from embedfleet.common.lifetime import dying_with_parent


def test_spawns_from_a_process_using_grpc_all_reach_their_program() -> None:
    """With a gRPC channel's event engine running, a fork() (as a preexec_fn forced) let gRPC's
    atfork handler restart its poller in the child, and close_fds closed its epoll descriptor
    under it: 16 of 300 children aborted before their exec. Each one must run."""

    async def spawn_all() -> list[int]:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")  # nothing listens: it only retries
        # The connection attempt starts the event engine's threads, as a client's would.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel.channel_ready(), 0.2)
        codes = []
        for _ in range(150):
            child = subprocess.Popen(
                dying_with_parent(["true"]), start_new_session=True, stderr=subprocess.DEVNULL
            )
            codes.append(child.wait())
        await channel.close(None)
        return codes

    codes = asyncio.run(spawn_all())
    assert codes == [0] * len(codes)


def test_a_child_gets_its_signal_when_the_thread_that_started_it_dies() -> None:
    """The parent is killed outright (no chance to stop its children), at once: whether it died
    before the parent-death signal was set or after, the child gets SIGTERM, which a `sleep`
    dies of."""
    script = textwrap.dedent(
        """
        import signal, subprocess, sys
        from embedfleet.common.lifetime import dying_with_parent
        child = subprocess.Popen(dying_with_parent(["sleep", "60"], signal.SIGTERM))
        print(child.pid, flush=True)
        sys.stdin.read()
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return  # gone (reaped by init)
        if state == "Z":
            return  # dead, waiting for init to reap it
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"child {pid} outlived its parent")
