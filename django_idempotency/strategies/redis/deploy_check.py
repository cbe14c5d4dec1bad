"""The deploy-time Redis check: connect as the app will and run what its strategy runs.

A wrong password, ``rediss://`` without the CA, a user whose ACL refuses a command or a
``REDIS_CLUSTER`` that does not match the server all leave every request on the database
fallback, with a warning per request. ``manage.py check --deploy`` (and only it: the check
is registered with ``deploy=True`` and the tag ``redis``, so start-up and a plain
``manage.py check`` never connect) finds them before the traffic does, each with its own
id (``E040``-``E047``, ``W040``). The probe works on keys of its own under
``REDIS_KEY_PREFIX`` and deletes them. See docs/redis.md ("Checking the connection").
"""

from __future__ import annotations

import contextlib
import ssl
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from ...conf import conf

ID = "django_idempotency."
TAG = "redis"
REDIS_STRATEGIES = {"redis", "hybrid"}
#: The scope of the probe's keys (a key no request can have: scopes are "user:…" etc.).
PROBE_SCOPE = "django_idempotency.check"
LOSS_STEP = "the hybrid loss check"
ACL_HINT = (
    "Grant the commands docs/redis.md lists for the strategy ('Redis ACL'), for instance "
    "ACL SETUSER <user> on ><password> ~<REDIS_KEY_PREFIX>:* &<REDIS_KEY_PREFIX>:* "
    "+@all -@dangerous +info."
)


class Unexpected(Exception):
    """Redis answered, but not as a working server would (the probe's own key taken...)."""


class ModeMismatch(Exception):
    """A single-node client (``REDIS_CLUSTER`` false) talks to a Redis Cluster node."""


@register(TAG, deploy=True)
def check_redis_connection(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Connect to the configured Redis and probe the commands the strategy needs."""
    if conf.STRATEGY not in REDIS_STRATEGIES or not (conf.REDIS_URL or conf.REDIS_CACHE_ALIAS):
        return []  # not a Redis strategy, or E011 already says what is missing
    try:
        from . import store as redis_store
    except ImportError:
        return []  # E006: the strategy cannot be loaded without redis
    try:
        client, owned = redis_store.new_client()
    except Exception as exc:
        return [message_for(exc, "connecting", "AUTH, CLUSTER SLOTS")]
    try:
        return probe(redis_store.RedisStore(client, conf.REDIS_KEY_PREFIX))
    finally:
        if owned:
            with contextlib.suppress(Exception):
                client.close()


def probe(store: Any) -> list[CheckMessage]:
    """Run the steps in order; the first failure is an Error (a refused loss check only a
    Warning: the hybrid strategy stays correct without it)."""
    messages: list[CheckMessage] = []
    for step, commands, run in steps(store):
        try:
            run()
        except Exception as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            if step == LOSS_STEP and _permission_denied(cause):
                messages.append(loss_check_warning(cause))
                continue
            messages.append(message_for(cause, step, commands))
            break
    return messages


def steps(store: Any) -> Iterator[tuple[str, str, Callable[[], None]]]:
    """(what, the commands it sends, how) for every operation the strategy uses."""
    from redis.cluster import RedisCluster

    client = store.client
    key = uuid.uuid4().hex
    token = uuid.uuid4().hex
    cluster = isinstance(client, RedisCluster)
    yield "connecting", "AUTH, PING", client.ping
    if not cluster:
        yield "the server mode", "HELLO", lambda: _single_node(client)
    yield "claiming a key", "SET NX PX GET, SCRIPT LOAD", lambda: _claim(store, key, token)
    yield "renewing the lease", "EVALSHA (GET, PEXPIRE)", lambda: _renew(store, key, token)
    yield "storing the response", "EVALSHA (GET, SET)", lambda: _complete(store, key, token)
    yield "replaying", "SET NX PX GET", lambda: _replay(store, key)
    yield "discarding", "EVALSHA (GET, DEL)", lambda: _discard(store, key, token)
    yield "releasing", "SET NX PX, EVALSHA (GET, DEL)", lambda: _release(store, key, token)
    yield "refilling", "SET PX", lambda: _refill(store, key, token)
    yield "waking the waiters", "PUBLISH", lambda: store.notify(PROBE_SCOPE, key)
    if conf.WAIT > 0:
        yield "waiting", "SUBSCRIBE", lambda: _subscribe(store)
    if conf.STRATEGY == "hybrid" and conf.HYBRID_DB_CHECK == "after_loss":
        yield LOSS_STEP, "EVALSHA (SET, MGET, INFO)", lambda: _loss_check(store, key, token)


def _expect(condition: object, what: str = "the probe's own record was not there") -> None:
    if not condition:
        raise Unexpected(what)


def _single_node(client: Any) -> None:
    """HELLO says "mode": a cluster node refuses most keys to a single-node client
    (MOVED). A server too old for HELLO, or a user not allowed it, is not told apart here;
    the probe's commands then fail with MOVED instead."""
    try:
        reply = client.execute_command("HELLO")
    except Exception:
        return
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    mode = reply.get(b"mode", reply.get("mode")) if isinstance(reply, dict) else None
    if mode in (b"cluster", "cluster"):
        raise ModeMismatch()


def _claim(store: Any, key: str, token: str) -> None:
    won, _record = store.claim(PROBE_SCOPE, key, "probe", token, 10_000)
    _expect(won, "the probe could not claim a key of its own")


def _renew(store: Any, key: str, token: str) -> None:
    _expect(store.renew(PROBE_SCOPE, key, token, 10_000))


def _complete(store: Any, key: str, token: str) -> None:
    from ...values.response import StoredResponse

    response = StoredResponse(status=201, headers={}, body=b"{}")
    _expect(store.complete(PROBE_SCOPE, key, token, response, 10_000))


def _replay(store: Any, key: str) -> None:
    won, record = store.claim(PROBE_SCOPE, key, "probe", uuid.uuid4().hex, 10_000)
    _expect(not won and record is not None and record.completed, "the completed probe was lost")


def _discard(store: Any, key: str, token: str) -> None:
    _expect(store.discard(PROBE_SCOPE, key, token))


def _release(store: Any, key: str, token: str) -> None:
    _claim(store, key, token)
    _expect(store.release(PROBE_SCOPE, key, token))


def _refill(store: Any, key: str, token: str) -> None:
    from ...values.response import StoredResponse

    response = StoredResponse(status=201, headers={}, body=b"{}")
    store.put_completed(PROBE_SCOPE, key, "probe", response, 10_000, token=token)
    _expect(store.discard(PROBE_SCOPE, key, token))


def _subscribe(store: Any) -> None:
    pubsub = store.client.pubsub()
    try:
        pubsub.subscribe(store.wake_channel)
        message = pubsub.get_message(timeout=max(conf.REDIS_SOCKET_TIMEOUT, 1.0))
        _expect(message is not None and message["type"] == "subscribe", "no SUBSCRIBE reply")
    finally:
        with contextlib.suppress(Exception):
            pubsub.close()


def _loss_check(store: Any, key: str, token: str) -> None:
    """The claim script with the loss check compared with INFO, on keys of the probe's own."""
    from redis.exceptions import ResponseError

    from .store import LossCheckDenied

    keys = _probe_loss_keys(store, key)
    store.verify_due = True
    try:
        won, _record, check = store.claim_checking_loss(
            PROBE_SCOPE,
            key,
            "probe",
            token,
            10_000,
            loss_keys=keys,
            window_ms=1,
            interval_ms=1,
            held_ms=10_000,
        )
        _expect(won, "the probe could not claim a key of its own")
        _expect(store.release(PROBE_SCOPE, key, token))
        if check.refused:
            raise LossCheckDenied(check.reason) from ResponseError(check.reason)
        _expect(check.verdict >= 0, f"the loss check failed: {check.reason}")
    finally:
        with contextlib.suppress(Exception):
            store.client.delete(*keys)
            store.client.delete(store.held_key(PROBE_SCOPE, key))


def _probe_loss_keys(store: Any, key: str) -> tuple[str, str, str]:
    """Loss keys of the probe's own, in its record's Cluster slot (never the real ones)."""
    from redis.crc import key_slot

    from ...values.keys import key_digest
    from .store import slot_tag

    tag = "hybrid-check"
    if store.cluster:
        tag = slot_tag(key_slot(key_digest(PROBE_SCOPE, key).encode()))
    base = f"{store.prefix}:{{{tag}}}:probe-"
    return base + "loss", base + "checked", base + "suspect"


# -- what a failure means -------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _permission_denied(exc: BaseException) -> bool:
    from .store import permission_denied

    return any(permission_denied(e) for e in _chain(exc))


def _target() -> str:
    if conf.REDIS_CACHE_ALIAS:
        return f"the cache {conf.REDIS_CACHE_ALIAS!r}"
    from .store import _safe

    return _safe(conf.REDIS_URL or "")


def _kind(exc: BaseException) -> str:
    """Which of the check's ids ``exc`` (raised by ``step``) stands for: the first of
    :data:`KINDS` whose test matches, else ``E047``."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    for kind, matches in KINDS:
        if matches(exc, chain, text):
            return kind
    return "E047"


Chain = list[BaseException]


def _any(chain: Chain, *types: type[BaseException]) -> bool:
    return any(isinstance(e, types) for e in chain)


def _cluster_node(exc: BaseException, chain: Chain, text: str) -> bool:
    return _any(chain, ModeMismatch) or text.startswith(("MOVED", "ASK "))


def _credentials(exc: BaseException, chain: Chain, text: str) -> bool:
    from redis.exceptions import AuthenticationError

    auth = ("WRONGPASS", "NOAUTH", "invalid username-password", "Authentication required")
    return _any(chain, AuthenticationError) or any(a in text for a in auth)


def _tls(exc: BaseException, chain: Chain, text: str) -> bool:
    return _any(chain, ssl.SSLError) or "SSL" in text


def _not_a_cluster(exc: BaseException, chain: Chain, text: str) -> bool:
    return "cluster mode is not enabled" in text.lower() or "cluster support disabled" in text


def _read_only(exc: BaseException, chain: Chain, text: str) -> bool:
    from redis.exceptions import ReadOnlyError

    return _any(chain, ReadOnlyError) or "READONLY" in text


def _unreachable(exc: BaseException, chain: Chain, text: str) -> bool:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return _any(chain, ConnectionError, TimeoutError, OSError) or _any(
        chain, RedisConnectionError, RedisTimeoutError
    )


#: The ids in the order they are tested: a refused command before "not a cluster", since
#: redis-py reports a refused CLUSTER SLOTS with E045's text.
KINDS: tuple[tuple[str, Callable[[BaseException, Chain, str], bool]], ...] = (
    ("E044", _cluster_node),
    ("E041", _credentials),
    ("E042", _tls),
    ("E043", lambda exc, chain, text: _permission_denied(exc)),
    ("E045", _not_a_cluster),
    ("E046", _read_only),
    ("E040", _unreachable),
)


def message_for(exc: BaseException, step: str, commands: str) -> Error:
    """The Error for ``exc``, raised while the probe was ``step`` (sending ``commands``)."""
    kind = _kind(exc)
    target = _target()
    text = {
        "E040": (
            f"Cannot reach Redis at {target} ({step}): {exc}",
            "Check REDIS_URL (host, port, database) or the cache's LOCATION, that Redis runs "
            "and that no firewall is in between; a redis:// URL against a TLS port fails like "
            "this too (use rediss://).",
        ),
        "E041": (
            f"Redis at {target} refused the credentials: {exc}",
            "Put the user and password in the URL (redis://<user>:<password>@host:port/db, "
            "or redis://:<password>@… for the default user) as set with requirepass or "
            "ACL SETUSER, and check that the user is 'on'.",
        ),
        "E042": (
            f"The TLS connection to Redis at {target} failed: {exc}",
            "With rediss://, give the CA that signed the server's certificate "
            "(?ssl_ca_certs=/path/to/ca.pem in REDIS_URL, or ssl_ca_certs in the cache's "
            "OPTIONS), and check that the host name matches the certificate and that the "
            "port speaks TLS.",
        ),
        "E043": (
            f"The Redis user may not run a command the {conf.STRATEGY} strategy needs "
            f"({step}: {commands}): {exc}",
            ACL_HINT,
        ),
        "E044": (
            f"IDEMPOTENCY['REDIS_CLUSTER'] is False, but {target} is a Redis Cluster node.",
            "Set REDIS_CLUSTER to True (REDIS_URL names any node of the cluster).",
        ),
        "E045": (
            f"IDEMPOTENCY['REDIS_CLUSTER'] is True, but {target} is not a Redis Cluster node.",
            "Set REDIS_CLUSTER to False for a single server (or one behind Sentinel).",
        ),
        "E046": (
            f"Redis at {target} is a read-only replica: {exc}",
            "Point REDIS_URL (or the cache's LOCATION) at the primary.",
        ),
        "E047": (
            f"Redis at {target} did not answer the probe as it should ({step}): {exc}",
            "Check the server's log; a full Redis under maxmemory-policy noeviction answers "
            "OOM, a proxy may not support Lua scripts (EVALSHA).",
        ),
    }[kind]
    return Error(text[0], hint=text[1], id=ID + kind)


def loss_check_warning(exc: BaseException) -> Warning:
    return Warning(
        "The Redis user may not run INFO, which the hybrid strategy's loss check "
        f"(HYBRID_DB_CHECK 'after_loss') needs: {exc}. Requests stay correct, but every "
        "new key is looked up in the database, as with 'always'.",
        hint="Grant +info to the user (ACL SETUSER <user> +info), or set HYBRID_DB_CHECK "
        "to 'always'.",
        id=ID + "W040",
    )
