"""Free TCP ports on 127.0.0.1, for local fleets, test harnesses and benchmarks.

Standard library only: hack/dev-cluster imports it before `make install` has run.
"""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(count: int) -> list[int]:
    """Returns `count` distinct ports that were free a moment ago.

    All sockets stay open until every port is picked, so the kernel cannot hand out one twice.
    """
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports
