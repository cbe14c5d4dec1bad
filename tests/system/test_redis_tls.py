"""The ``redis`` and ``hybrid`` strategies over TLS, configured by the recipes of
docs/redis.md ("TLS"), on private TLS-only ``redis-server`` processes whose certificates
a CA made with ``openssl`` for this module signed; one requires client certificates
(``tls-auth-clients yes``), one does not.

Requests go through the test DRF view (one ``SideEffect`` row per execution); a 500
would raise out of the test client.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE
from django_idempotency.strategies.redis import store as redis_store
from tests.testapp.models import SideEffect

from ..support.api import (
    api_client,
    assert_runs_once_and_replays,
    post_json,
    race_held,
    replayed,
)
from ..support.docs import recipe
from ..support.factories import UserFactory
from ..support.redis_servers import RedisServer
from ..support.tls import TlsFiles

pytestmark = [
    pytest.mark.redis_tls,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]

#: The recipes of docs/redis.md "TLS", in their order there.
RECIPES = {"url": 0, "django-redis": 1, "django": 2}
CLIENT_CERT_IN_URL = (
    '"&ssl_certfile=/etc/redis/tls/client.pem"\n        "&ssl_keyfile=/etc/redis/tls/client.key"'
)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles.generate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def mutual(tls: TlsFiles) -> Iterator[RedisServer]:
    """A TLS-only server that requires a client certificate signed by the CA."""
    with RedisServer(tls=tls, tls_auth_clients="yes").start() as server:
        yield server


@pytest.fixture(scope="module")
def one_way(tls: TlsFiles) -> Iterator[RedisServer]:
    """A TLS-only server that asks no client certificate."""
    with RedisServer(tls=tls, tls_auth_clients="no").start() as server:
        yield server


def tls_recipe(
    name: str, server: RedisServer, tls: TlsFiles, more: dict[str, str] | None = None
) -> dict[str, Any]:
    """A recipe of docs/redis.md "TLS" with the test's server and certificate directory."""
    replacements = {
        **(more or {}),  # first: they name the recipe's own text
        "redis.internal:6380": f"127.0.0.1:{server.port}",
        "/etc/redis/tls/": f"{tls.ca.parent}/",
    }
    return recipe("redis.md", "TLS", RECIPES[name], replacements)


@pytest.fixture
def configure(settings: Any, redis_prefix: str) -> Iterator[Callable[..., None]]:
    """``configure(namespace, **more)``: the recipe's CACHES and IDEMPOTENCY, ``more`` on
    top of IDEMPOTENCY (and a key prefix of the test's own)."""

    def apply(namespace: dict[str, Any], **more: Any) -> None:
        if "CACHES" in namespace:
            settings.CACHES = {**settings.CACHES, **namespace["CACHES"]}
        settings.IDEMPOTENCY = {
            **namespace["IDEMPOTENCY"],
            "REDIS_KEY_PREFIX": redis_prefix,
            **more,
        }

    yield apply
    redis_store.reset_clients()


def _new_key_replay_and_race(server: RedisServer, prefix: str) -> None:
    """A new key runs once and is replayed, a race of 10 threads on one key runs once, and
    the records are on ``server`` (checked through redis-cli over TLS). A racer whose claim
    went unanswered (its reply took longer than the socket timeout, twice) would get a 503
    with ``Retry-After``: its claim's outcome is unknown, so it never runs."""
    user = UserFactory()
    client = api_client(user)
    key = uuid.uuid4().hex
    assert_runs_once_and_replays(client, key)

    raced = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(10)]
    responses = race_held(10, lambda i, body: post_json(clients[i], raced, body), raced)
    assert set(Counter(r.status_code for r in responses)) <= {201, 409, 503}
    assert sum(r.status_code == 201 and not replayed(r) for r in responses) == 1
    for unknown in (r for r in responses if r.status_code == 503):
        assert unknown.json()["type"].endswith("store-unavailable")
        assert int(unknown["Retry-After"]) >= 1
    assert replayed(post_json(client, raced, {"hold": raced}))
    assert SideEffect.objects.count() == 2
    assert IdempotencyKey.objects.count() == 0  # Redis took every claim, no fallback
    stored = server.cli("--scan", "--pattern", f"{prefix}:*:rec").split()
    assert len(stored) == 2, stored


#: What the tests of a working server wait for a reply, in place of the recipes' 0.25 s
#: (``REDIS_SOCKET_TIMEOUT``'s default too), which are for a Redis next door. On a busy
#: machine a TLS handshake can take longer; a racer that times out then falls back to the
#: db strategy and runs the view a second time (the documented limit of
#: ``REDIS_FAILURE_MODE = "db"``), which is no claim about TLS.
PATIENT = 10.0


def patient(namespace: dict[str, Any]) -> dict[str, Any]:
    """The recipe with every socket timeout it sets raised to ``PATIENT``."""
    options = namespace.get("CACHES", {}).get("idempotency", {}).get("OPTIONS", {})
    for name in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"):
        for spelled in (name, name.lower()):
            if spelled in options:
                options[spelled] = PATIENT
    namespace["IDEMPOTENCY"] = {**namespace["IDEMPOTENCY"], "REDIS_SOCKET_TIMEOUT": PATIENT}
    return namespace


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_mutual_tls_recipes_new_key_replay_and_race(
    mutual: RedisServer, tls: TlsFiles, configure: Any, redis_prefix: str, name: str, strategy: str
) -> None:
    configure(patient(tls_recipe(name, mutual, tls)), STRATEGY=strategy)
    client = redis_store.get_client()
    assert isinstance(client, redis.Redis)
    assert issubclass(client.connection_pool.connection_class, redis.SSLConnection)
    _new_key_replay_and_race(mutual, redis_prefix)


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
def test_the_ca_alone_in_the_url_for_a_server_without_client_certificates(
    one_way: RedisServer, tls: TlsFiles, configure: Any, redis_prefix: str, strategy: str
) -> None:
    namespace = tls_recipe("url", one_way, tls, {CLIENT_CERT_IN_URL: '""'})
    assert "ssl_certfile" not in namespace["IDEMPOTENCY"]["REDIS_URL"]
    configure(patient(namespace), STRATEGY=strategy)
    _new_key_replay_and_race(one_way, redis_prefix)


def _failing_url(case: str, mutual: RedisServer, one_way: RedisServer, tls: TlsFiles) -> str:
    """A URL whose TLS connection cannot be made, for each way it can go wrong."""
    if case == "no-ca":  # only the system's CAs, which never signed the test CA
        return one_way.url
    if case == "other-ca":
        return f"{one_way.url}?ssl_ca_certs={tls.other_ca}"
    if case == "no-client-certificate":
        return f"{mutual.url}?ssl_ca_certs={tls.ca}"
    assert case == "plain-to-a-tls-port"
    return f"redis://127.0.0.1:{one_way.port}/0"


FAILURES = ["no-ca", "other-ca", "no-client-certificate", "plain-to-a-tls-port"]


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_tls_connection_falls_back_to_the_db_strategy(
    mutual: RedisServer,
    one_way: RedisServer,
    tls: TlsFiles,
    configure: Any,
    caplog: pytest.LogCaptureFixture,
    case: str,
    strategy: str,
) -> None:
    url = _failing_url(case, mutual, one_way, tls)
    configure({"IDEMPOTENCY": {"REDIS_URL": url}}, STRATEGY=strategy, REDIS_FAILURE_MODE="db")
    client = api_client(UserFactory())
    key = uuid.uuid4().hex
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = post_json(client, key, {"amount": 5})
    assert first.status_code == 201 and not replayed(first)
    assert IdempotencyKey.objects.filter(key=key).exists()  # the db strategy took it
    assert any("Redis is unavailable" in r.getMessage() for r in caplog.records)
    if case in {"no-ca", "other-ca"}:
        assert "certificate verify failed" in caplog.text
    again = post_json(client, key, {"amount": 5})
    assert again.status_code == 201 and replayed(again)
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_tls_connection_fail_closed_is_503(
    mutual: RedisServer, one_way: RedisServer, tls: TlsFiles, configure: Any, case: str
) -> None:
    url = _failing_url(case, mutual, one_way, tls)
    configure(
        {"IDEMPOTENCY": {"REDIS_URL": url}}, STRATEGY="redis", REDIS_FAILURE_MODE="fail_closed"
    )
    response = post_json(api_client(UserFactory()), uuid.uuid4().hex, {"amount": 5})
    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    assert response.json()["type"].endswith("store-unavailable")
    assert SideEffect.objects.count() == 0
