"""The deploy-time Redis check (``manage.py check --deploy``) against real private servers:
a wrong password, a missing ACL permission, a cluster/single-node mismatch, a replica, TLS
without the CA, and an ordinary ``check`` that never connects."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command

from django_idempotency.strategies.redis import store as redis_store

from ...support.ports import free_port
from ...support.redis_servers import Blackhole, RedisClusterNodes, RedisServer

pytestmark = [pytest.mark.redis]

HYBRID_MINIMAL = (
    "-@all +get +set +evalsha +script|load +pexpire +del +publish +subscribe +ping +hello "
    "+info +mget"
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A private server of this module's own (its ACL users reach no other test)."""
    node = RedisServer().start()
    try:
        yield node
    finally:
        node.cleanup()


@pytest.fixture
def configure(settings: Any, redis_prefix: str) -> Iterator[Callable[..., None]]:
    def apply(url: str, **more: Any) -> None:
        settings.IDEMPOTENCY = {
            "STRATEGY": "hybrid",
            "REDIS_URL": url,
            "REDIS_KEY_PREFIX": redis_prefix,
            "REDIS_SOCKET_TIMEOUT": 1.0,
            "WAIT": 2,
            **more,
        }

    yield apply
    redis_store.reset_clients()


def deploy_ids() -> list[str]:
    messages = run_checks(include_deployment_checks=True, tags=["redis"])
    return [m.id.removeprefix("django_idempotency.") for m in messages if m.id]


def _user(server: RedisServer, prefix: str, rules: str) -> str:
    return server.set_user("app", "secret", f"~{prefix}:*", f"&{prefix}:*", *rules.split())


def test_ordinary_checks_never_connect(configure: Callable[..., None], settings: Any) -> None:
    """Only ``--deploy`` connects: against a socket that accepts and never answers, a plain
    check makes no connection, the deploy check one (and reports E040)."""
    hole = Blackhole()
    try:
        configure(hole.url)
        hole.sock.setblocking(False)
        assert [m.id for m in run_checks() if "E04" in (m.id or "")] == []
        # The suite's URLconf has views with steps, which hybrid does not run (E091).
        settings.SILENCED_SYSTEM_CHECKS = ["django_idempotency.E091"]
        call_command("check")  # what start-up and CI's plain check run
        with pytest.raises(BlockingIOError):
            hole.sock.accept()  # nobody connected
        assert deploy_ids() == ["E040"]
        hole.sock.accept()[0].close()
    finally:
        hole.close()


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_the_documented_minimal_user_passes(
    server: RedisServer, configure: Callable[..., None], redis_prefix: str, strategy: str
) -> None:
    configure(_user(server, redis_prefix, HYBRID_MINIMAL), STRATEGY=strategy)
    try:
        assert deploy_ids() == []
        # The probe deletes what it wrote.
        client = redis_store.get_client()
        assert [k for k in server_keys(server, redis_prefix)] == []
        client.close()
    finally:
        server.delete_user("app")


def server_keys(server: RedisServer, prefix: str) -> list[bytes]:
    import redis

    admin = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        return list(admin.scan_iter(match=f"{prefix}:*"))
    finally:
        admin.close()


def test_without_info_hybrid_is_a_warning_and_redis_passes(
    server: RedisServer, configure: Callable[..., None], redis_prefix: str
) -> None:
    """``+@all -@dangerous``: the hybrid strategy stays correct without INFO (W040); the
    redis strategy needs nothing of @dangerous."""
    url = _user(server, redis_prefix, "+@all -@dangerous")
    try:
        configure(url)
        assert deploy_ids() == ["W040"]
        configure(url, HYBRID_DB_CHECK="always")
        assert deploy_ids() == []
        configure(url, STRATEGY="redis")
        assert deploy_ids() == []
    finally:
        server.delete_user("app")


def test_a_wrong_password_is_e041(server: RedisServer, configure: Callable[..., None]) -> None:
    server.set_user("app", "secret", "~*", "+@all")
    try:
        configure(server.user_url("app", "not-the-password"))
        assert deploy_ids() == ["E041"]
    finally:
        server.delete_user("app")


@pytest.mark.parametrize(
    ("missing", "named"),
    [("publish", "PUBLISH"), ("evalsha", "EVALSHA"), ("subscribe", "SUBSCRIBE"), ("del", "DEL")],
)
def test_a_missing_permission_is_e043_naming_the_step(
    server: RedisServer,
    configure: Callable[..., None],
    redis_prefix: str,
    missing: str,
    named: str,
) -> None:
    configure(_user(server, redis_prefix, HYBRID_MINIMAL + f" -{missing}"))
    try:
        messages = run_checks(include_deployment_checks=True, tags=["redis"])
        assert [m.id for m in messages] == ["django_idempotency.E043"]
        assert named in messages[0].msg and "ACL SETUSER" in (messages[0].hint or "")
    finally:
        server.delete_user("app")


def test_a_key_pattern_that_misses_the_prefix_is_e043(
    server: RedisServer, configure: Callable[..., None]
) -> None:
    """The user's keys (``~other:*``) do not cover REDIS_KEY_PREFIX: refused keys are E043."""
    configure(server.set_user("app", "secret", "~other:*", "&*", "+@all"))
    try:
        messages = run_checks(include_deployment_checks=True, tags=["redis"])
        assert [m.id for m in messages] == ["django_idempotency.E043"]
        assert "claiming a key" in messages[0].msg
    finally:
        server.delete_user("app")


def test_a_cluster_node_without_redis_cluster_is_e044(
    redis_cluster: RedisClusterNodes, configure: Callable[..., None]
) -> None:
    configure(redis_cluster.url, REDIS_CLUSTER=False)
    assert deploy_ids() == ["E044"]
    configure(redis_cluster.url, REDIS_CLUSTER=True)
    assert deploy_ids() == []


@pytest.fixture
def cluster_user(redis_cluster: RedisClusterNodes) -> Iterator[Callable[..., str]]:
    """``cluster_user(*rules)``: the ACL user ``app`` on every node (ACLs are per node)."""
    yield lambda *rules: redis_cluster.set_user("app", "secret", *rules)
    redis_cluster.delete_user("app")


def test_a_cluster_user_needs_cluster_slots_and_command(
    cluster_user: Callable[..., str], configure: Callable[..., None], redis_prefix: str
) -> None:
    """The documented cluster ACL passes; without CLUSTER SLOTS (which redis-py reports as
    "Cluster mode is not enabled") it is E043, not E045; a wrong password E041."""
    keys = (f"~{redis_prefix}:*", f"&{redis_prefix}:*")
    url = cluster_user(*keys, *HYBRID_MINIMAL.split(), "+cluster|slots", "+command")
    configure(url, REDIS_CLUSTER=True)
    assert deploy_ids() == []
    configure(url, REDIS_CLUSTER=True, STRATEGY="redis")
    assert deploy_ids() == []
    configure(cluster_user(*keys, "+@all", "-cluster|slots"), REDIS_CLUSTER=True)
    assert deploy_ids() == ["E043"]
    configure(url.replace(":secret@", ":wrong@"), REDIS_CLUSTER=True)
    assert deploy_ids() == ["E041"]


def test_a_single_node_with_redis_cluster_is_e045(
    server: RedisServer, configure: Callable[..., None]
) -> None:
    configure(server.url, REDIS_CLUSTER=True)
    assert deploy_ids() == ["E045"]


def test_a_replica_is_e046(server: RedisServer, configure: Callable[..., None]) -> None:
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(server.port))).start()
    try:
        configure(replica.url)
        assert deploy_ids() == ["E046"]
    finally:
        replica.cleanup()


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 that it signed (openssl CLI)."""
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem")
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
            "-out", str(ca), "-days", "1", "-subj", "/CN=idem-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


def test_tls_without_the_ca_is_e042(tmp_path: Path, configure: Callable[..., None]) -> None:
    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    tls = RedisServer(
        extra=("--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file",
               str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"),
    ).start()  # fmt: skip
    try:
        configure(f"rediss://127.0.0.1:{port}/0")
        assert deploy_ids() == ["E042"]
        configure(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
        assert deploy_ids() == []
        configure(f"redis://127.0.0.1:{port}/0")  # plain text against the TLS port
        assert deploy_ids() == ["E040"]
    finally:
        tls.cleanup()


def test_a_cache_alias_is_checked_with_the_cache_s_client(
    server: RedisServer, configure: Callable[..., None], settings: Any
) -> None:
    """REDIS_CACHE_ALIAS: the probe runs on the cache's own client, and names the cache."""
    server.set_user("app", "secret", "~*", "&*", "+@all")
    try:
        settings.CACHES = {
            **settings.CACHES,
            "idem": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": server.user_url("app", "wrong"),
            },
        }
        configure("", REDIS_CACHE_ALIAS="idem")
        messages = run_checks(include_deployment_checks=True, tags=["redis"])
        assert [m.id for m in messages] == ["django_idempotency.E041"]
        assert "the cache 'idem'" in messages[0].msg
        settings.CACHES["idem"]["LOCATION"] = server.user_url("app", "secret")
        settings.CACHES = dict(settings.CACHES)
        assert deploy_ids() == []
    finally:
        server.delete_user("app")


def test_the_probe_keys_are_its_own(server: RedisServer, configure: Callable[..., None]) -> None:
    """A record of a real key under the prefix is left as it was."""
    configure(server.url)
    store = redis_store.get_store()
    key = uuid.uuid4().hex
    assert store.claim("user:1", key, "f", "t" * 32, 60_000) == (True, None)
    assert deploy_ids() == []
    record = store.get("user:1", key)
    assert record is not None and record.token == "t" * 32
