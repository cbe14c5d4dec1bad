"""Child processes of a measure: free loopback ports, and stopping a process group."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from contextlib import closing


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port nothing listens on now; ``with_bus``: port + 10000 too (a Redis
    Cluster node's bus)."""
    if not with_bus:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = random.randint(20000, 39999)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _is_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def stop_group(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM to the process group of ``process`` (started with ``start_new_session``),
    SIGKILL when it outlives ``timeout``."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
