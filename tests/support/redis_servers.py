"""Private Redis servers for tests that must flush, kill or cluster Redis.

``RedisServer`` runs one ``redis-server`` on a free loopback port, without
persistence, as a child process that ``stop()`` terminates. ``paused()`` stops
one (SIGSTOP) for a block, a server that hangs instead of failing. ``RedisClusterNodes``
runs six of them with ``--cluster-enabled yes`` and joins them with
``redis-cli --cluster create ... --cluster-replicas 1`` (3 primaries, 3 replicas).
``RedisSentinels`` runs a master, its replica and three ``redis-server --sentinel``
processes watching them, with short timings so that a failover takes a few seconds.
A ``RedisServer`` with ``tls`` listens on a TLS port only. The shared Redis on port 6379
is never touched.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .ports import free_port
from .proxy import FaultProxy
from .tls import TlsFiles


def _cli(port: int, *args: str, timeout: float = 10, tls: TlsFiles | None = None) -> str:
    secure = () if tls is None else _tls_cli_args(tls)
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *secure, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result.stdout + result.stderr


def _probe(port: int, *args: str, tls: TlsFiles | None = None) -> str:
    """``redis-cli`` asked in a wait loop: "" when it has not answered in 2 s (a server
    that is starting or failing over, a busy machine), and the loop asks again."""
    try:
        return _cli(port, *args, timeout=2, tls=tls)
    except subprocess.TimeoutExpired:
        return ""


def _tls_cli_args(tls: TlsFiles) -> tuple[str, ...]:
    """redis-cli over TLS, trusting the test CA and showing the client certificate."""
    return (
        "--tls",
        "--cacert",
        str(tls.ca),
        "--cert",
        str(tls.client_cert),
        "--key",
        str(tls.client_key),
    )


def _tls_server_args(port: int, tls: TlsFiles, auth_clients: str) -> tuple[str, ...]:
    """Listen on ``port`` with TLS only (``--port 0`` closes the plain port)."""
    return (
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(tls.server_cert),
        "--tls-key-file",
        str(tls.server_key),
        "--tls-ca-cert-file",
        str(tls.ca),
        "--tls-auth-clients",
        auth_clients,
    )


@dataclass
class RedisServer:
    """One private ``redis-server``; ``url`` points at it, ``stop()`` ends it.

    ``config``: a configuration file given before the options (a sentinel needs one it
    can rewrite). ``tls``: listen on ``port`` with TLS only, and ``tls_auth_clients``
    (``"no"``, ``"yes"`` or ``"optional"``) says whether clients must show a certificate.
    """

    port: int = 0
    extra: tuple[str, ...] = ()
    directory: Path | None = None
    config: Path | None = None
    tls: TlsFiles | None = None
    tls_auth_clients: str = "no"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        scheme = "redis" if self.tls is None else "rediss"
        return f"{scheme}://127.0.0.1:{self.port}/0"

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
        listen = (
            ("--port", str(self.port))
            if self.tls is None
            else _tls_server_args(self.port, self.tls, self.tls_auth_clients)
        )
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                *(() if self.config is None else (str(self.config),)),
                *listen,
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
            if _probe(self.port, "PING", tls=self.tls).strip() == "PONG":
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer:\n{self.log()}")

    def cli(self, *args: str, timeout: float = 10) -> str:
        """``redis-cli`` against this server (over TLS when it has ``tls``)."""
        return _cli(self.port, *args, timeout=timeout, tls=self.tls)

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

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The server stopped (SIGSTOP) for the block, then resumed (SIGCONT): a hung Redis.
        The kernel still accepts connections and takes in what clients send, but nothing
        answers, so every command times out on the client's side; the commands sent
        meanwhile are read (and applied) once the server runs again."""
        assert self.process is not None and self.process.poll() is None, "not running"
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

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

    def __enter__(self) -> RedisServer:
        """``with RedisServer(...).start() as server:``: the server is cleaned up after."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()


def wait_replicated(port: int, timeout: float = 20) -> None:
    """Until a replica of the primary on 127.0.0.1:``port`` is online and has acknowledged
    everything the primary has written (replicas acknowledge once a second)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                info = client.info("replication")
            except redis.TimeoutError:  # a busy machine: ask again
                continue
            written = int(info.get("master_repl_offset", 0))
            replicas = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
            if any(
                r.get("state") == "online" and int(r.get("offset", -1)) >= written for r in replicas
            ):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise RuntimeError(f"no replica of 127.0.0.1:{port} caught up within {timeout} s")


@dataclass
class RedisClusterNodes:
    """Six private cluster nodes: 3 primaries with one replica each.

    ``proxied``: each node announces, as the address its clients reach it at, a
    :class:`~tests.support.proxy.FaultProxy` in front of it (``cluster-announce-port``, as
    behind a NAT), so that a test can slow down or silence the whole cluster's traffic
    with its clients (:attr:`proxies`); the cluster bus between the nodes is direct."""

    nodes: list[RedisServer] = field(default_factory=list)
    proxied: bool = False
    #: The proxy in front of each node, by the node's own port (``proxied`` only).
    proxies: dict[int, FaultProxy] = field(default_factory=dict)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """A startup node for ``RedisCluster.from_url`` (through its proxy when proxied)."""
        first = self.nodes[0]
        proxy = self.proxies.get(first.port)
        return first.url if proxy is None else f"redis://127.0.0.1:{proxy.port}/0"

    def _announce(self, port: int) -> tuple[str, ...]:
        """The node's options that announce its proxy (none when not proxied)."""
        if not self.proxied:
            return ()
        proxy = self.proxies[port] = FaultProxy("127.0.0.1", port).start()
        return (
            "--cluster-announce-ip",
            "127.0.0.1",
            "--cluster-announce-port",
            str(proxy.port),
            "--cluster-announce-bus-port",
            str(port + 10000),
        )

    def _start_node(self, root: Path, tries: int = 5) -> RedisServer:
        """A cluster node on a free port pair, started; on another port when a process
        outside this one bound the port between the check and the node's start."""
        for _ in range(tries - 1):
            try:
                return self._node(root, free_port(with_bus=True)).start()
            except RuntimeError as exc:
                if "Address already in use" not in str(exc):
                    raise
        return self._node(root, free_port(with_bus=True)).start()

    def _node(self, root: Path, port: int) -> RedisServer:
        directory = root / str(port)
        directory.mkdir()
        return RedisServer(
            port=port,
            directory=directory,
            extra=(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(directory / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                *self._announce(port),
            ),
        )

    def start(self, count: int = 6, timeout: float = 60) -> RedisClusterNodes:
        self._tmp = tempfile.TemporaryDirectory(prefix="idem-redis-cluster-")
        root = Path(self._tmp.name)
        try:
            for _ in range(count):
                self.nodes.append(self._start_node(root))
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
        """Until a replica of the primary on ``port`` has everything it wrote."""
        wait_replicated(port, timeout)

    def set_user(self, name: str, password: str, *rules: str) -> str:
        """The ACL user on every node (a cluster does not share ACLs); a startup URL."""
        for node in self.nodes:
            node.set_user(name, password, *rules)
        return self.nodes[0].user_url(name, password)

    def delete_user(self, name: str) -> None:
        for node in self.nodes:
            node.delete_user(name)

    def primaries(self) -> list[int]:
        """The ports of the primaries that own slots (their own, not their proxies')."""
        out = _cli(self.nodes[0].port, "CLUSTER", "NODES")
        behind = {proxy.port: port for port, proxy in self.proxies.items()}
        ports = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 9 and "master" in parts[2] and "fail" not in parts[2]:
                port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                ports.append(behind.get(port, port))
        return sorted(ports)

    @contextlib.contextmanager
    def silenced(self) -> Iterator[None]:
        """Every proxy silent for the block (``proxied`` only): the clients' commands are
        held, unanswered, and delivered when the block ends."""
        assert self.proxies, "not a proxied cluster"
        for proxy in self.proxies.values():
            proxy.silence()
        try:
            yield
        finally:
            for proxy in self.proxies.values():
                proxy.heal()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Every primary stopped (SIGSTOP) for the block, then resumed: a hung cluster. No
        replica takes over, however long the block: a failover needs the votes of a majority
        of the primaries, and none of them runs."""
        ports = set(self.primaries())
        with contextlib.ExitStack() as stack:
            for node in self.nodes:
                if node.port in ports:
                    stack.enter_context(node.paused())
            yield

    @contextlib.contextmanager
    def replies_lost(self) -> Iterator[None]:
        """What every node sends is lost for the block (``proxied`` only), what its clients
        send is applied; the connections are reset after it."""
        assert self.proxies, "not a proxied cluster"
        for proxy in self.proxies.values():
            proxy.lose_replies()
        try:
            yield
        finally:
            for proxy in self.proxies.values():
                proxy.reset()
                proxy.heal()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes.clear()
        for proxy in self.proxies.values():
            proxy.stop()
        self.proxies.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@dataclass
class RedisSentinels:
    """A master, one replica of it, and three sentinels (quorum 2) that watch it as
    ``service``; ``down_after_ms`` and ``failover_timeout_ms`` are kept short so that a
    killed master is replaced within a few seconds."""

    service: str = "mymaster"
    down_after_ms: int = 800
    failover_timeout_ms: int = 3000
    master: RedisServer | None = None
    replica: RedisServer | None = None
    sentinels: list[RedisServer] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The sentinels, as django-redis's ``SENTINELS`` option lists them."""
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    def start(self, timeout: float = 30) -> RedisSentinels:
        self._tmp = tempfile.TemporaryDirectory(prefix="idem-redis-sentinel-")
        root = Path(self._tmp.name)
        try:
            self.master = self._server(root, "master").start()
            replica_of = ("--replicaof", "127.0.0.1", str(self.master.port))
            self.replica = self._server(root, "replica", replica_of).start()
            for number in range(3):
                directory = root / f"sentinel-{number}"
                directory.mkdir()
                config = directory / "sentinel.conf"
                config.write_text(
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                )
                sentinel = RedisServer(directory=directory, config=config, extra=("--sentinel",))
                self.sentinels.append(sentinel.start())
            self._wait_discovered(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _server(root: Path, name: str, extra: tuple[str, ...] = ()) -> RedisServer:
        directory = root / name
        directory.mkdir()
        return RedisServer(directory=directory, extra=extra)

    def _wait_discovered(self, timeout: float) -> None:
        """Until every sentinel knows the replica and the two other sentinels (they find
        each other through the master's hello channel), so that a failover has a quorum."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = 0
            for sentinel in self.sentinels:
                client = redis.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=2)
                peers: Any = []
                replicas: Any = []
                try:
                    peers = client.sentinel_sentinels(self.service)
                    replicas = client.sentinel_slaves(self.service)
                except redis.RedisError:
                    pass
                finally:
                    client.close()
                online = [r for r in replicas if not r.get("is_sdown") and r.get("flags")]
                ready += len(peers) == 2 and len(online) == 1
            if ready == len(self.sentinels):
                return
            time.sleep(0.2)
        raise RuntimeError("the sentinels did not discover each other and the replica")

    def reported_master(self, sentinel: RedisServer) -> int | None:
        """The master's port as ``sentinel`` reports it (None when it does not answer)."""
        answer = _probe(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        words = answer.split()
        return int(words[1]) if len(words) == 2 and words[1].isdigit() else None

    def healthy_master(self, sentinel: RedisServer, port: int) -> bool:
        """Whether ``sentinel``'s record of the master (``SENTINEL MASTER``, the record
        redis-py's discovery reads) names ``port`` and passes its ``check_master_state``:
        flagged a master, neither subjectively nor objectively down. A sentinel can report
        the promoted replica's address before its record of it passes that check, and
        discovery skips such a sentinel (a quiet run of the suite found no master right after
        every sentinel had reported the new address)."""
        words = _probe(sentinel.port, "SENTINEL", "MASTER", self.service).split()
        fields = dict(zip(words[::2], words[1::2], strict=False))
        flags = set(fields.get("flags", "").split(","))
        return (
            fields.get("port") == str(port)
            and "master" in flags
            and not flags & {"s_down", "o_down"}
        )

    def wait_master(self, port: int, timeout: float = 30) -> None:
        """Until every sentinel still running reports ``port`` as a healthy master and it
        answers as one: until redis-py's discovery finds it through any of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [sentinel for sentinel in self.sentinels if sentinel.running]
            if (
                live
                and all(self.healthy_master(sentinel, port) for sentinel in live)
                and _probe(port, "ROLE").split()[:1] == ["master"]
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not promote 127.0.0.1:{port} within {timeout} s")

    def cut_replication(self, timeout: float = 10) -> None:
        """Let the replica fall behind: the master refuses ``PSYNC``/``SYNC`` (an ACL on
        its default user) and drops the replica's link, so what is written from now on
        never reaches the replica, while clients and sentinels still talk to the master."""
        assert self.master is not None and self.replica is not None
        self.master.cli("ACL", "SETUSER", "default", "-psync", "-sync")
        self.master.cli("CLIENT", "KILL", "TYPE", "replica")
        deadline = time.monotonic() + timeout
        while "master_link_status:down" not in self.replica.cli("INFO", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica's link to the master did not go down")
            time.sleep(0.05)

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            if server is not None:
                server.stop()
        self.sentinels.clear()
        self.master = self.replica = None
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
        self._taken: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def connections(self) -> int:
        """How many connections clients made since the last call: each attempt of a
        command that was not answered (a retry makes one more). Counted by accepting them,
        kept open and unread, so that a client still on one sees no difference."""
        self.sock.setblocking(False)
        taken = 0
        try:
            while True:
                self._taken.append(self.sock.accept()[0])
                taken += 1
        except BlockingIOError:
            return taken
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        for connection in self._taken:
            connection.close()
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
