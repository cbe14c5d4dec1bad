"""The Redis a measure uses: a private ``redis-server`` (or a 6-node cluster) on free ports.

A private server has no persistence and lives in a temporary directory that goes with it;
nothing is written to the shared Redis. ``BENCH_REDIS_URL`` set makes ``redis_for`` use that
server instead, and delete the run's keys (by prefix) afterwards, never flushing it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from .processes import free_port


def _cli(port: int, *args: str) -> str:
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return result.stdout + result.stderr


@contextmanager
def redis_server(
    directory: Path | None = None, *extra: str, cluster: bool = False
) -> Iterator[tuple[str, int]]:
    """A private ``redis-server`` on a free loopback port: its URL and port. ``cluster``:
    a cluster node (its bus port free too)."""
    if cluster:
        extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "2000", *extra)  # fmt: skip
    with ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="idem-redis-")))
        port = free_port(with_bus=cluster)
        command = [
            shutil.which("redis-server") or "redis-server", "--port", str(port),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(directory), "--logfile", str(directory / "redis.log"), *extra,
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while _cli(port, "PING").strip() != "PONG":
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0", port
        finally:
            process.terminate()
            process.wait(10)


@contextmanager
def redis_cluster() -> Iterator[str]:
    """Six private cluster nodes, 3 primaries with a replica each; a startup node's URL."""
    with tempfile.TemporaryDirectory(prefix="idem-redis-cluster-") as tmp, ExitStack() as stack:
        ports = []
        for index in range(6):
            directory = Path(tmp) / str(index)
            directory.mkdir()
            ports.append(stack.enter_context(redis_server(directory, cluster=True))[1])
        addresses = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=True,
        )
        deadline = time.monotonic() + 60
        while not all("cluster_state:ok" in _cli(port, "CLUSTER", "INFO") for port in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{ports[0]}/0"


@contextmanager
def redis_for(prefix: str) -> Iterator[str]:
    """``BENCH_REDIS_URL`` when set (this run's keys under ``prefix`` deleted afterwards),
    else a private server."""
    url = os.environ.get("BENCH_REDIS_URL")
    if not url:
        with redis_server() as (private, _port):
            yield private
        return
    try:
        yield url
    finally:
        import redis

        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()
