"""The Redis strategies as a least-privileged Redis user, on a private ``redis-server``.

Two users: the common hardening ``+@all -@dangerous`` (which refuses ``INFO``), and the
minimal ACL that docs/redis.md lists per strategy. Every Lua script is run with each of
its commands refused in turn, and the keyspace must be what it was: a script that fails
halfway leaves nothing behind (Redis does not undo a script's writes).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.status import IN_PROGRESS
from django_idempotency.strategies.redis import store as redis_store
from django_idempotency.strategies.redis.health import monitor
from django_idempotency.strategies.redis.store import (
    PREPARED,
    RedisRecord,
    RedisStore,
    RedisUnavailable,
    encode_record,
    get_store,
    permission_denied,
)
from tests.testapp.models import SideEffect

from ..support.api import (
    api_client,
    assert_runs_once_and_replays,
    post_json,
    race_held,
    replayed,
)
from ..support.factories import UserFactory
from ..support.redis_servers import RedisClusterNodes, RedisServer

pytestmark = [
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("forget_queued_drains"),
]

#: The ACLs docs/redis.md gives ("Redis ACL"), ``{prefix}`` standing for REDIS_KEY_PREFIX.
MINIMAL = {
    "redis": "~{prefix}:* &{prefix}:* -@all +get +set +evalsha +script|load +pexpire +del "
    "+publish +subscribe +ping +hello",
    "hybrid": "~{prefix}:* &{prefix}:* -@all +get +set +evalsha +script|load +pexpire +del "
    "+publish +subscribe +ping +hello +info +mget",
}
HARDENED = "~{prefix}:* &* +@all -@dangerous"


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A private server of this module's own: its ACL users never reach other tests."""
    with RedisServer().start() as server:
        yield server


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(host="127.0.0.1", port=acl_server.port, socket_timeout=5)
    yield client
    client.close()


def _rules(template: str, prefix: str) -> list[str]:
    return template.format(prefix=prefix).split()


# -- no script leaves a partial write -------------------------------------------------------

SCOPE, TOKEN = "user:1", "a" * 32


def _seed_in_progress(store: RedisStore, admin: redis.Redis, key: str) -> None:
    record = RedisRecord(IN_PROGRESS, "f" * 64, TOKEN, None)
    admin.set(store.record_key(SCOPE, key), encode_record(record), px=100_000)


def _seed_held(store: RedisStore, admin: redis.Redis, key: str) -> None:
    """In progress under hybrid: the record and the held mark its claim wrote."""
    _seed_in_progress(store, admin, key)
    admin.set(store.held_key(SCOPE, key), "1", px=100_000)


RESPONSE = StoredResponse(status=201, headers={}, body=b"{}")


def _seed_prepared(store: RedisStore, admin: redis.Redis, key: str) -> None:
    """The redis strategy's completion before its COMMIT."""
    record = RedisRecord(PREPARED, "f" * 64, TOKEN, RESPONSE)
    admin.set(store.record_key(SCOPE, key), encode_record(record), px=100_000)


#: Per script constant of redis_store: (prepare the state it acts on, run it).
SCRIPT_RUNS: dict[str, tuple[Callable[..., None], Callable[[RedisStore, str], object]]] = {
    # hybrid's renewal, which extends the held mark too (the redis strategy's has none)
    "RENEW_LUA": (_seed_held, lambda s, k: s.renew(SCOPE, k, TOKEN, 5000, held_ms=100_000)),
    "COMPLETE_LUA": (
        _seed_in_progress,
        lambda s, k: s.complete(SCOPE, k, TOKEN, RESPONSE, 60_000),
    ),
    "CONFIRM_LUA": (_seed_prepared, lambda s, k: s.confirm(SCOPE, k, TOKEN, notify=True)),
    "RELEASE_LUA": (_seed_in_progress, lambda s, k: s.release(SCOPE, k, TOKEN)),
    "DISCARD_LUA": (_seed_in_progress, lambda s, k: s.discard(SCOPE, k, TOKEN)),
    "LOSS_LUA": (lambda *a: None, lambda s, k: s.loss_suspected(s.loss_keys(), 60_000, 10)),
    "CLAIM_LUA": (lambda *a: None, lambda s, k: _claim_checking_loss(s, k)),
    "CLAIM6_LUA": (lambda *a: None, lambda s, k: _claim_checking_loss(s, k, redis6=True)),
}


def _claim_checking_loss(store: RedisStore, key: str, *, redis6: bool = False) -> Any:
    if redis6:
        store._set_nx_get = False  # the script for Redis 6, on this Redis 7 server
    return store.claim_checking_loss(
        SCOPE,
        key,
        "f" * 64,
        TOKEN,
        5000,
        loss_keys=store.loss_keys(),
        window_ms=60_000,
        interval_ms=10,
        held_ms=10_000,
    )


def _scripts() -> dict[str, str]:
    return {name: value for name, value in vars(redis_store).items() if name.endswith("_LUA")}


def _cases() -> list[tuple[str, str]]:
    return [
        (name, command.lower())
        for name, script in sorted(_scripts().items())
        for command in sorted(set(re.findall(r"redis\.call\('(\w+)'", script)))
    ]


def _keyspace(admin: redis.Redis, prefix: str) -> dict[Any, tuple[Any, bool]]:
    """Every key under the prefix: its value, and whether it lives longer than 50 s."""
    return {
        name: (admin.get(name), admin.pttl(name) > 50_000 or admin.pttl(name) == -1)
        for name in admin.scan_iter(match=f"{prefix}:*")
    }


def test_every_script_is_audited() -> None:
    assert sorted(_scripts()) == sorted(SCRIPT_RUNS)


@pytest.mark.parametrize(("script", "command"), _cases())
def test_a_refused_command_leaves_the_keyspace_as_it_was(
    acl_server: RedisServer, admin: redis.Redis, redis_prefix: str, script: str, command: str
) -> None:
    """Each command of each script refused in turn: the script fails, and every key under
    the prefix has the value and the time to live it had (nothing half-written)."""
    url = acl_server.set_user("partial", "pw", f"~{redis_prefix}:*", "&*", "+@all", f"-{command}")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        store = RedisStore(client, redis_prefix)
        key = uuid.uuid4().hex
        prepare, run = SCRIPT_RUNS[script]
        prepare(store, admin, key)
        before = _keyspace(admin, redis_prefix)
        with pytest.raises(RedisUnavailable) as raised:
            run(store, key)
        cause = raised.value.__cause__
        assert cause is not None and permission_denied(cause), raised.value
        assert _keyspace(admin, redis_prefix) == before
    finally:
        client.close()
        acl_server.delete_user("partial")


@pytest.mark.parametrize("refused", ["info", "mget"])
def test_a_claim_whose_loss_check_is_refused_is_a_claim_that_says_so(
    acl_server: RedisServer, admin: redis.Redis, redis_prefix: str, refused: str
) -> None:
    """``-@dangerous`` refuses INFO (or an ACL leaves MGET out): the claim script does not
    fail after its write, which would leave a claim nobody holds until LOCK_TIMEOUT; it
    answers the claim, and that the loss check was refused (the strategy then looks the key
    up in the database). Nothing of the loss check is written."""
    rules = [*_rules(HARDENED, redis_prefix), f"-{refused}"]
    url = acl_server.set_user("app", "secret", *rules)
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        store = RedisStore(client, redis_prefix)
        won, record, check = _claim_checking_loss(store, "k")
        assert (won, record) == (True, None)
        assert check.verdict == -1 and check.refused, check
        assert admin.exists(store.record_key(SCOPE, "k")) == 1
        assert admin.exists(*store.loss_keys()) == 0
        assert store.release(SCOPE, "k", TOKEN)
    finally:
        client.close()
        acl_server.delete_user("app")


# -- every strategy as such a user, through the views ---------------------------------------

USERS = {"hardened": HARDENED, "minimal": None}


@pytest.fixture(params=[(s, u) for s in ("redis", "hybrid") for u in USERS], ids=str)
def as_user(
    request: Any, settings: Any, acl_server: RedisServer, redis_prefix: str
) -> Iterator[str]:
    """The strategy on the private server, logged in as the ACL user; yields the strategy."""
    strategy, user = request.param
    template = USERS[user] or MINIMAL[strategy]
    url = acl_server.set_user("app", "secret", *_rules(template, redis_prefix))
    settings.IDEMPOTENCY = {
        "STRATEGY": strategy,
        "REDIS_URL": url,
        "REDIS_KEY_PREFIX": redis_prefix,
        "REDIS_SOCKET_TIMEOUT": 1.0,
        "HYBRID_DB_CHECK": "after_loss",
        "WAIT": 60,  # the longest a duplicate waits: a slow first request, not a hung one
    }
    monitor.reset()
    yield strategy
    redis_store.reset_clients()
    acl_server.delete_user("app")


def test_new_key_replay_mismatch_and_release_run_in_redis(
    as_user: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    client = api_client(UserFactory())
    key = uuid.uuid4().hex
    assert_runs_once_and_replays(client, key)
    # A 5xx rolls the view back and releases the key: the retry runs the view again, and
    # is then replayed.
    failing = uuid.uuid4().hex
    assert post_json(client, failing, {"status": 500}).status_code == 500
    retry = post_json(client, failing, {"status": 201})
    assert retry.status_code == 201 and not replayed(retry)
    assert replayed(post_json(client, failing, {"status": 201}))
    assert SideEffect.objects.count() == 2
    # Nothing fell back to the db strategy (it would have written IdempotencyKey rows).
    assert IdempotencyKey.objects.count() == 0
    assert not monitor.active
    assert not [r for r in caplog.records if "is handled by the db strategy" in r.getMessage()]


def test_racing_threads_run_the_view_once_and_the_waiters_replay(as_user: str) -> None:
    """Eight real threads on one key; the duplicates wait (WAIT, woken by SUBSCRIBE) and
    replay the one execution."""
    user = UserFactory()
    key = uuid.uuid4().hex
    clients = [api_client(user) for _ in range(8)]
    responses = race_held(8, lambda i, body: post_json(clients[i], key, body), key)
    assert [r.status_code for r in responses] == [201] * 8
    assert sum(not replayed(r) for r in responses) == 1
    assert SideEffect.objects.count() == 1
    assert IdempotencyKey.objects.count() == 0


def test_hybrid_without_info_checks_the_database_and_says_so_once(
    settings: Any,
    acl_server: RedisServer,
    admin: redis.Redis,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``-@dangerous``: the loss check is refused; the claim is made again without it and
    every new key is looked up in the database (as ``"always"``), logged at ERROR once."""
    url = acl_server.set_user("app", "secret", *_rules(HARDENED, redis_prefix))
    settings.IDEMPOTENCY = {
        "STRATEGY": "hybrid",
        "REDIS_URL": url,
        "REDIS_KEY_PREFIX": redis_prefix,
        "HYBRID_DB_CHECK": "after_loss",
    }
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    try:
        client = api_client(UserFactory())
        key = uuid.uuid4().hex
        assert post_json(client, key, {"amount": 5}).status_code == 201
        assert get_store().loss_check_refused_at is not None
        # A key the database has but Redis lost is replayed: the lookup ran.
        admin.delete(*admin.keys(f"{redis_prefix}:*"))
        lost = post_json(client, key, {"amount": 5})
        assert lost.status_code == 201 and replayed(lost)
        for _ in range(3):
            assert post_json(client, uuid.uuid4().hex, {"amount": 1}).status_code == 201
        refused = [r for r in caplog.records if "may not run INFO" in r.getMessage()]
        assert [r.levelno for r in refused] == [logging.ERROR]
        assert SideEffect.objects.count() == 4
        assert IdempotencyKey.objects.count() == 0
    finally:
        redis_store.reset_clients()
        acl_server.delete_user("app")


@pytest.mark.parametrize("strategy", ["redis", "hybrid"])
@pytest.mark.parametrize("user", ["hardened", "minimal"])
def test_on_a_cluster_as_the_user(
    settings: Any, redis_cluster: RedisClusterNodes, redis_prefix: str, strategy: str, user: str
) -> None:
    """The same users on a private 3-primary cluster (the minimal ACL plus CLUSTER SLOTS and
    COMMAND, as documented): claim, replay, mismatch and a race, all in Redis."""
    template = HARDENED if user == "hardened" else MINIMAL[strategy] + " +cluster|slots +command"
    url = redis_cluster.set_user("app", "secret", *_rules(template, redis_prefix))
    settings.IDEMPOTENCY = {
        "STRATEGY": strategy,
        "REDIS_URL": url,
        "REDIS_CLUSTER": True,
        "REDIS_KEY_PREFIX": redis_prefix,
        "REDIS_SOCKET_TIMEOUT": 1.0,
    }
    try:
        user_row = UserFactory()
        client = api_client(user_row)
        key = uuid.uuid4().hex
        assert post_json(client, key, {"amount": 5}).status_code == 201
        assert replayed(post_json(client, key, {"amount": 5}))
        assert post_json(client, key, {"amount": 6}).status_code == 422
        racing = uuid.uuid4().hex
        clients = [api_client(user_row) for _ in range(6)]
        send = lambda i, body: post_json(clients[i], racing, body)  # noqa: E731
        statuses = race_held(6, send, racing)
        assert sorted({r.status_code for r in statuses}) <= [201, 409]
        assert SideEffect.objects.count() == 2
        assert IdempotencyKey.objects.count() == 0
    finally:
        redis_store.reset_clients()
        redis_cluster.delete_user("app")
