"""A slowloris client in a process of its own: N connections that send a request line and a Host
header, then stall, reopened whenever the server closes them, until SIGTERM.

    python -m embedfleet.testing.slowloris --port 8080 --connections 5000 --ramp-seconds 10

The first N are opened at a steady rate over `--ramp-seconds`: with the ramp as long as the
server's header bound, N stay open from then on, each closed by the server and reopened in its
turn, the steady state of N stalled connections. With no ramp they all open at once and are all
closed and reopened together every header bound: a connection flood on top of the stall.

It prints one JSON line once each of the N has been opened (`{"open": ..., "started": N}`) and
one when it stops (totals), so a test waits for the first and reads the second. A process of its
own so that its sockets and event loop cost nothing in the measuring client's process, running at
the lowest priority once all are open; it raises its own open-file limit (up to the hard limit)
first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

#: a request line and one header, never finished: the server waits for the rest
STALL = b"POST /v1/embeddings HTTP/1.1\r\nHost: slowloris\r\n"
#: connections being opened at once (more only queue in the kernel's backlog)
OPENING = 256


class Attack:
    def __init__(self, host: str, port: int, connections: int, ramp_seconds: float = 0.0) -> None:
        self.host, self.port, self.connections = host, port, connections
        self.ramp_seconds = ramp_seconds
        self.open = 0
        self.opened = 0
        #: connections (of N) that have been opened at least once
        self.started = 0
        self.closed_by_server = 0
        self.refused = 0
        self._gate = asyncio.Semaphore(OPENING)
        self._announced = False

    async def _one(self, index: int, stop: asyncio.Event) -> None:
        await asyncio.sleep(self.ramp_seconds * index / self.connections)
        first = True
        while not stop.is_set():
            async with self._gate:
                try:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.write(STALL)
                    await writer.drain()
                except OSError:
                    self.refused += 1
                    await asyncio.sleep(0.1)
                    continue
            self.opened += 1
            self.open += 1
            self.started += first
            first = False
            self._announce()
            try:
                # Whatever comes back (a 408, a 503 past the cap) ends with the server's close.
                waiting = asyncio.ensure_future(reader.read())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait((waiting, stopping), return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if waiting.done():
                    self.closed_by_server += 1
                else:
                    waiting.cancel()
            except OSError:
                self.closed_by_server += 1
            finally:
                self.open -= 1
                writer.close()

    def _announce(self) -> None:
        # Every one opened once: with a ramp as long as the header bound the first are being
        # closed and reopened by now, so "all open at one instant" may never quite happen.
        if not self._announced and self.started >= self.connections:
            self._announced = True
            # From now on only idle CPU: a real attacker's own work runs on other machines, and on
            # a shared test machine it would otherwise be counted against the server.
            os.nice(19)
            print(json.dumps({"open": self.open, "started": self.started}), flush=True)

    async def run(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await asyncio.gather(*(self._one(i, stop) for i in range(self.connections)))
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
    asyncio.run(Attack(args.host, args.port, args.connections, args.ramp_seconds).run())


if __name__ == "__main__":
    main()
