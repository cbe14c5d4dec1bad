"""Free loopback ports."""

from __future__ import annotations

import random
import socket
from contextlib import closing


def port_is_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


#: The cluster ports' own generator, from the system's entropy: pytest-randomly seeds the
#: ``random`` module alike in every worker of a run (so that they shuffle the tests alike),
#: and workers that started a Redis Cluster at the same point of the run drew the same ports.
_DRAWS = random.SystemRandom()
#: The cluster ports this process has handed out (a node binds its port later).
_HANDED_OUT: set[int] = set()


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; ``with_bus``: port + 10000 (a Redis Cluster bus) is free too."""
    if not with_bus:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = _DRAWS.randint(20000, 39999)
        if port in _HANDED_OUT:
            continue
        if port_is_free(port) and port_is_free(port + 10000):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")
