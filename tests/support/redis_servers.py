"""Private Redis servers for tests that must flush, kill or cluster Redis.

``RedisServer`` runs one ``redis-server`` on a free loopback port, without
persistence, as a child process that ``stop()`` terminates. ``RedisClusterNodes``
runs six of them with ``--cluster-enabled yes`` and joins them with
``redis-cli --cluster create ... --cluster-replicas 1`` (3 primaries, 3 replicas).
The shared Redis on port 6379 is never touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from .ports import free_port


def _cli(port: int, *args: str, timeout: float = 10) -> str:
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result.stdout + result.stderr


@dataclass
class RedisServer:
    """One private ``redis-server``; ``url`` points at it, ``stop()`` ends it."""

    port: int = 0
    extra: tuple[str, ...] = ()
    directory: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def user_url(self, name: str, password: str) -> str:
        """The URL that logs in as the ACL user ``name``."""
        return f"redis://{name}:{password}@127.0.0.1:{self.port}/0"

    def set_user(self, name: str, password: str, *rules: str) -> str:
        """``ACL SETUSER name reset on >password *rules`` (as the default user); the URL."""
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            client.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *rules)
        finally:
            client.close()
        return self.user_url(name, password)

    def delete_user(self, name: str) -> None:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            client.execute_command("ACL", "DELUSER", name)
        finally:
            client.close()

    def start(self, timeout: float = 10) -> RedisServer:
        if self.directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="idem-redis-")
            self.directory = Path(self._tmp.name)
        if not self.port:
            self.port = free_port()
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.directory),
                "--logfile",
                str(self.directory / f"redis-{self.port}.log"),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{self.log()}")
            if _cli(self.port, "PING", timeout=2).strip() == "PONG":
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer:\n{self.log()}")

    def log(self) -> str:
        if self.directory is None:
            return ""
        path = self.directory / f"redis-{self.port}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would; ``start()`` brings it back."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.directory = None


@dataclass
class RedisClusterNodes:
    """Six private cluster nodes: 3 primaries with one replica each."""

    nodes: list[RedisServer] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """A startup node for ``RedisCluster.from_url``."""
        return self.nodes[0].url

    def start(self, count: int = 6, timeout: float = 60) -> RedisClusterNodes:
        self._tmp = tempfile.TemporaryDirectory(prefix="idem-redis-cluster-")
        root = Path(self._tmp.name)
        try:
            for _ in range(count):
                port = free_port(with_bus=True)
                directory = root / str(port)
                directory.mkdir()
                node = RedisServer(
                    port=port,
                    directory=directory,
                    extra=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(directory / "nodes.conf"),
                        "--cluster-node-timeout",
                        "2000",
                    ),
                )
                self.nodes.append(node)
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            result = subprocess.run(
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
                text=True,
                timeout=timeout,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 60) -> None:
        """Until every node reports ``cluster_state:ok`` and 3 primaries own all slots."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [_cli(node.port, "CLUSTER", "INFO") for node in self.nodes]
            if all("cluster_state:ok" in state for state in states) and len(self.primaries()) == 3:
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def wait_replicated(self, port: int, timeout: float = 20) -> None:
        """Until a replica of the primary on ``port`` is online and has acknowledged
        everything the primary has written (replicas acknowledge once a second)."""
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                info = client.info("replication")
                written = int(info.get("master_repl_offset", 0))
                replicas = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
                if any(
                    r.get("state") == "online" and int(r.get("offset", -1)) >= written
                    for r in replicas
                ):
                    return
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"no replica of 127.0.0.1:{port} caught up within {timeout} s")

    def set_user(self, name: str, password: str, *rules: str) -> str:
        """The ACL user on every node (a cluster does not share ACLs); a startup URL."""
        for node in self.nodes:
            node.set_user(name, password, *rules)
        return self.nodes[0].user_url(name, password)

    def delete_user(self, name: str) -> None:
        for node in self.nodes:
            node.delete_user(name)

    def primaries(self) -> list[int]:
        """The ports of the primaries that own slots."""
        out = _cli(self.nodes[0].port, "CLUSTER", "NODES")
        ports = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 9 and "master" in parts[2] and "fail" not in parts[2]:
                ports.append(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(ports)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


class Blackhole:
    """A TCP port that accepts connections and never answers: a hung Redis.

    The kernel completes the handshake (the socket listens) but nothing ever reads,
    so a client waits until its own socket timeout.
    """

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.sock.close()


def closed_port_url() -> str:
    """A Redis URL on a loopback port where nothing listens (connection refused)."""
    return f"redis://127.0.0.1:{free_port()}/0"


def delete_prefix(url: str, prefix: str) -> None:
    """Delete the keys under ``prefix:`` on the Redis at ``url`` (never a flush)."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
        client.close()
    except redis.RedisError:
        pass
