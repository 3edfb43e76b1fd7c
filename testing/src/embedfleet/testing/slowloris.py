"""A slowloris client in a process of its own: N connections that send a request line and a Host
header, then stall, reopened whenever the server closes them, until SIGTERM.

    python -m embedfleet.testing.slowloris --port 8080 --connections 5000 --ramp-seconds 10

The first N are opened at a steady rate over `--ramp-seconds`: with the ramp as long as the
server's header bound, N stay open from then on, each closed by the server and reopened in its
turn, the steady state of N stalled connections. With no ramp they all open at once and are all
closed and reopened together every header bound: a connection flood on top of the stall.

It prints one JSON line once each of the N has been opened (`{"open": ..., "started": N}`) and
one when it stops (totals), so a test waits for the first and reads the second. A process of its
own so that its sockets cost nothing in the measuring client's process; it raises its own
open-file limit (up to the hard limit) first.

A real attacker's work runs on other machines; on a test machine this one shares the server's
cores, so it must cost little and still react at once. Hence plain non-blocking sockets on one
epoll loop (a reopen is a few system calls, no streams, tasks or futures) at normal priority:
an asyncio version at the lowest priority, tried first, cost the server's cores several times
more and, starved by its neighbours, reopened what the server had closed in bursts of hundreds.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import json
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType

#: a request line and one header, never finished: the server waits for the rest
STALL = b"POST /v1/embeddings HTTP/1.1\r\nHost: slowloris\r\n"
#: connections being opened at once (more only queue in the kernel's backlog)
OPENING = 256
#: the wait before reopening a connection the server refused
REFUSED_SECONDS = 0.1
#: the longest the loop sleeps, so that SIGTERM is seen soon
TICK_SECONDS = 0.1


class Attack:
    def __init__(self, host: str, port: int, connections: int, ramp_seconds: float = 0.0) -> None:
        self.address = (host, port)
        self.connections, self.ramp_seconds = connections, ramp_seconds
        self.open = 0
        self.opened = 0
        #: connections (of N) that have been opened at least once
        self.started = 0
        self.closed_by_server = 0
        self.refused = 0
        self.stopping = False
        self._poll = select.epoll()
        #: fd -> (slot, socket, connected yet)
        self._sockets: dict[int, tuple[int, socket.socket, bool]] = {}
        #: (when, slot) for slots waiting to be opened
        self._due: list[tuple[float, int]] = []
        self._ever = [False] * connections
        self._opening = 0
        self._announced = False

    def _connect(self, slot: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(self.address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._refused(slot)
            return
        self._opening += 1
        self._sockets[sock.fileno()] = (slot, sock, False)
        self._poll.register(sock.fileno(), select.EPOLLOUT)

    def _refused(self, slot: int) -> None:
        self.refused += 1
        heapq.heappush(self._due, (time.monotonic() + REFUSED_SECONDS, slot))

    def _writable(self, fd: int) -> None:
        slot, sock, _ = self._sockets[fd]
        self._opening -= 1
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        try:
            if code:
                raise OSError(code, "connect")
            sock.send(STALL)
        except OSError:
            self._drop(fd)
            self._refused(slot)
            return
        self._sockets[fd] = (slot, sock, True)
        self._poll.modify(fd, select.EPOLLIN)
        self.opened += 1
        self.open += 1
        if not self._ever[slot]:
            self._ever[slot] = True
            self.started += 1
            self._announce()

    def _readable(self, fd: int) -> None:
        # Whatever comes back (a 408, a 503 past the cap) ends with the server's close.
        slot, sock, _ = self._sockets[fd]
        try:
            if sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.closed_by_server += 1
        self.open -= 1
        self._drop(fd)
        self._connect(slot)

    def _drop(self, fd: int) -> None:
        _, sock, _ = self._sockets.pop(fd)
        self._poll.unregister(fd)
        sock.close()

    def _announce(self) -> None:
        # Every one opened once: with a ramp as long as the header bound the first are being
        # closed and reopened by now, so "all open at one instant" may never quite happen.
        if not self._announced and self.started >= self.connections:
            self._announced = True
            print(json.dumps({"open": self.open, "started": self.started}), flush=True)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        t0 = time.monotonic()
        self._due = [
            (t0 + self.ramp_seconds * i / self.connections, i) for i in range(self.connections)
        ]
        while not self.stopping:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now and self._opening < OPENING:
                self._connect(heapq.heappop(self._due)[1])
            wait = TICK_SECONDS
            if self._due and self._opening < OPENING:
                wait = min(wait, max(0.0, self._due[0][0] - now))
            for fd, _ in self._poll.poll(wait):
                if fd not in self._sockets:
                    continue
                if self._sockets[fd][2]:
                    self._readable(fd)
                else:
                    self._writable(fd)
        for fd in list(self._sockets):
            self._drop(fd)
        totals = {
            "opened": self.opened,
            "closed_by_server": self.closed_by_server,
            "refused": self.refused,
        }
        print(json.dumps(totals), flush=True)


def raise_open_files(wanted: int) -> int:
    """Soft RLIMIT_NOFILE up to `wanted` (at most the hard limit); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


@contextlib.contextmanager
def stalled(
    port: int, connections: int, ramp_seconds: float, host: str = "127.0.0.1"
) -> Iterator[dict[str, int]]:
    """`connections` stalled connections to host:port from a slowloris process for the block's
    duration, the block entered once all are open; the dict it yields is filled with the
    attacker's totals when the block ends."""
    totals: dict[str, int] = {}
    attack = subprocess.Popen(
        [sys.executable, "-m", "embedfleet.testing.slowloris", "--host", host, "--port", str(port),
         "--connections", str(connections), "--ramp-seconds", str(ramp_seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert attack.stdout is not None
        opened = json.loads(attack.stdout.readline() or "{}")
        if opened.get("started") != connections:
            raise RuntimeError(f"slowloris did not open {connections} connections: {opened}")
        yield totals
    finally:
        attack.terminate()
        out, _ = attack.communicate(timeout=60)
    lines = out.strip().splitlines()
    totals.update(json.loads(lines[-1]) if lines else {})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="slowloris", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--ramp-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    room = raise_open_files(args.connections + 64)
    if room < args.connections + 16:
        sys.exit(f"slowloris: the open-file limit {room} is too low for {args.connections}")
    Attack(args.host, args.port, args.connections, args.ramp_seconds).run()


if __name__ == "__main__":
    main()
