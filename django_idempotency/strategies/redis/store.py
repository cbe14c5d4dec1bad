"""The Redis side of the ``redis`` and ``hybrid`` strategies (imports ``redis``).

One compact-JSON record per (scope, key), under a key whose hash tag keeps it in one
Redis Cluster slot; the claim is one ``SET NX PX``, and renew, complete and release are
Lua compare-and-set scripts on the claim token. Every method raises
:class:`RedisUnavailable` when Redis cannot be reached or answers with an error. See
docs/redis.md.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import redis
from django.core.signals import setting_changed
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.retry import Retry

from ...conf import conf
from ...errors import RedisNotConfigured
from ...store.status import COMPLETED, IN_PROGRESS
from ...values.attempt import Attempt
from ...values.keys import key_digest
from ...values.response import StoredResponse
from .outcome import ClusterClient, failure
from .outcome import RedisUnavailable as RedisUnavailable  # re-exported: the name callers know

RedisClient = Union[redis.Redis, RedisCluster]  # noqa: UP007 - a runtime alias


#: Errors that mean "the store did not answer as it should" (redis-py wraps socket errors).
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError)


# -- clients -------------------------------------------------------------------------------

_Ident = tuple[str, str, bool, float]
_clients: dict[_Ident, RedisClient] = {}
_clients_lock = threading.Lock()


def get_client() -> RedisClient:
    """The Redis client named by the settings, kept once per process and target.

    ``REDIS_CACHE_ALIAS`` wins: the raw client of that cache, a django-redis cache or
    Django's own ``django.core.cache.backends.redis.RedisCache`` (its own ``OPTIONS``
    set the timeouts). Otherwise ``REDIS_URL``, as a ``RedisCluster``
    when ``REDIS_CLUSTER`` is true, with both socket timeouts set to
    ``REDIS_SOCKET_TIMEOUT`` and no retry with back-off on a single node (a dead
    server costs one timeout, not several). Raises ``RedisUnavailable`` when a
    cluster cannot be reached to read its topology, and ``RedisNotConfigured``
    (an ``ImproperlyConfigured``) when neither setting is given.
    """
    ident = _ident()
    client = _clients.get(ident)
    if client is not None:
        return client
    # Built outside the lock: a Cluster client reads the topology as it is built, and with
    # the cluster hung each request waits for its own attempt, not for those before it.
    built = _connect(ident)
    with _clients_lock:
        client = _clients.setdefault(ident, built)
    if client is not built and ident[0] == "url":
        with contextlib.suppress(*REDIS_ERRORS):
            built.close()  # another thread's came first
    return client


def _ident() -> _Ident:
    """What makes a client: the cache alias, or the URL, the cluster flag and the socket
    timeout (a changed timeout gets a client of its own, not the one built before)."""
    alias = conf.REDIS_CACHE_ALIAS
    url = conf.REDIS_URL
    if alias:
        return ("alias", alias, False, 0.0)
    if url:
        return ("url", url, conf.REDIS_CLUSTER, conf.REDIS_SOCKET_TIMEOUT)
    raise RedisNotConfigured(
        "The redis and hybrid idempotency strategies need IDEMPOTENCY['REDIS_URL'] "
        "or IDEMPOTENCY['REDIS_CACHE_ALIAS']."
    )


def new_client() -> tuple[RedisClient, bool]:
    """A client for the settings that no request shares (the deploy check), and whether
    the caller closes it (not the client of a cache, which belongs to the cache)."""
    ident = _ident()
    return _connect(ident), ident[0] == "url"


def _connect(ident: _Ident) -> RedisClient:
    kind, target, cluster, timeout = ident
    if kind == "alias":
        return _cache_client(target)
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if cluster:
        # ClusterClient tries once more when nothing was sent: it follows a failover.
        try:
            return ClusterClient.from_url(target, **options)
        except REDIS_ERRORS as exc:
            raise RedisUnavailable(f"cannot reach the Redis Cluster at {_safe(target)}") from exc
    return redis.Redis.from_url(target, **options)


def _cache_client(alias: str) -> RedisClient:
    """The raw client of the cache ``alias``: Django's built-in Redis backend or django-redis.

    Django's backend gives its write client, the one of its first server (the primary);
    django_redis is imported only for a django-redis cache.
    """
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches[alias]
    if isinstance(cache, RedisCache):
        return cache._cache.get_client(write=True)
    from django_redis import get_redis_connection

    return get_redis_connection(alias)  # type: ignore[no-any-return]


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def reset_clients() -> None:
    """Close and forget the cached clients, and the cached settings (tests, or after
    changing the settings without ``setting_changed``)."""
    conf.reload()
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
        _stores.clear()
        _current.clear()
    for client in clients:
        with contextlib.suppress(*REDIS_ERRORS):
            client.close()


# -- records -------------------------------------------------------------------------------


#: The ``redis`` strategy's completion written before the view's transaction commits, with
#: that transaction's id: confirmed (``completed``) once COMMIT has returned. A record found
#: prepared is replayed only once the database says that transaction committed
#: (``strategies.redis.prepared``).
PREPARED = "prepared"


@dataclass(frozen=True)
class RedisRecord:
    """What Redis holds for one (scope, key)."""

    status: str  # IN_PROGRESS, PREPARED or COMPLETED
    fingerprint: str
    token: str
    response: StoredResponse | None
    #: A prepared record's transaction id (None: the database cannot tell its outcome).
    xid: int | None = None

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    @property
    def prepared(self) -> bool:
        return self.status == PREPARED


#: One encoder for every value (``json.dumps`` with options builds a new one per call).
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


_plain = re.compile(r"[A-Za-z0-9_.:\-]*\Z").match


def redis_scope(attempt: Attempt) -> str:
    """The scope that names ``attempt``'s record in Redis, which every key database
    shares: the scope, preceded by the key's database when requests are routed over
    several (a scope such as ``user:42`` may name another user on each shard)."""
    return f"db:{attempt.shard}\x1f{attempt.scope}" if attempt.shard else attempt.scope


def _string(value: str) -> str:
    """``value`` as a JSON string; hex tokens and fingerprints skip the encoder."""
    if _plain(value):
        return '"' + value + '"'
    return _json(value)


def encode_response(response: StoredResponse) -> str:
    """``{"c": status, "h": headers, "b": base64 body}``."""
    body = base64.b64encode(response.body).decode("ascii")
    return _json({"c": response.status, "h": response.headers, "b": body})


def encode_record(record: RedisRecord) -> bytes:
    """Compact JSON; the body is base64 so that any bytes survive."""
    response = "null" if record.response is None else encode_response(record.response)
    return (
        '{"s":'
        + _string(record.status)
        + ',"f":'
        + _string(record.fingerprint)
        + ',"r":'
        + response
        + token_tail(record.token)
    ).encode("ascii")


def new_token() -> str:
    """A claim token: 128 random bits as 32 hex digits (like ``uuid4().hex``)."""
    return os.urandom(16).hex()


def decode_record(raw: bytes | str) -> RedisRecord | None:
    """The record in ``raw``, or None when it is not one of ours (treated as absent)."""
    try:
        payload = json.loads(raw)
        response_data = payload.get("r")
        response = None
        if response_data is not None:
            response = StoredResponse(
                status=int(response_data["c"]),
                headers={str(k): str(v) for k, v in dict(response_data.get("h") or {}).items()},
                body=base64.b64decode(response_data.get("b") or ""),
            )
        xid = payload.get("x")
        return RedisRecord(
            status=str(payload["s"]),
            fingerprint=str(payload["f"]),
            token=str(payload["t"]),
            response=response,
            xid=None if xid is None else int(xid),
        )
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return None


# -- scripts -------------------------------------------------------------------------------
#
# The scripts compare strings instead of decoding JSON (20 µs of cjson per call
# otherwise): every value is written as
#     {"s":"<status>","f":<fingerprint>,"r":<response or null>,"t":<token>}
# with the token last, so the caller passes the exact tail ``,"t":"<token>"}`` and
# a record is the caller's exactly when it ends with it (JSON escaping leaves no
# other way for that text to end a value).

# KEYS[1] record, KEYS[2] (hybrid, optional) the key's held mark; ARGV[1] token tail;
# ARGV[2] lease in ms; ARGV[3] the held mark's life in ms (with KEYS[2]).
RENEW_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local head = '{"s":"in_progress",'
if string.sub(v, 1, #head) ~= head or string.sub(v, -#ARGV[1]) ~= ARGV[1] then
  return 0
end
if KEYS[2] then redis.call('SET', KEYS[2], '1', 'PX', ARGV[3]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

# KEYS[1] record; ARGV[1] token tail; ARGV[2] the response as JSON; ARGV[3] ttl in ms;
# ARGV[4] (optional) the status written, "completed" unless given ("prepared"); ARGV[5]
# (optional) what follows the response (',"x":<transaction id>'). The record keeps the
# fingerprint and the token of the claim. A record already completed or prepared under the
# same token answers 1 as well: a completion sent again because the first one's reply never
# came (its outcome unknown) finds its own work done.
COMPLETE_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local tail = ARGV[1]
if string.sub(v, -#tail) ~= tail then return 0 end
if string.sub(v, 1, 17) == '{"s":"completed",' or string.sub(v, 1, 16) == '{"s":"prepared",' then
  return 1
end
local head = '{"s":"in_progress",'
if string.sub(v, 1, #head) ~= head then return 0 end
local middle = string.sub(v, #head + 1, #v - #tail)
local empty = ',"r":null'
if string.sub(middle, -#empty) ~= empty then return 0 end
local fingerprint = string.sub(middle, 1, #middle - #empty)
redis.call('SET', KEYS[1], '{"s":"' .. (ARGV[4] or 'completed') .. '",' .. fingerprint
  .. ',"r":' .. ARGV[2] .. (ARGV[5] or '') .. tail, 'PX', ARGV[3])
return 1
"""

# KEYS[1] record; ARGV[1] token tail; ARGV[2] a channel to PUBLISH ARGV[3] on ("": none).
# A prepared record under this token becomes completed, with the time to live it has left
# (KEEPTTL, Redis 6: no command beyond those of the ACL docs/redis.md lists); 1 when the
# record is (now) completed under this token, else 0 (gone, or another's).
CONFIRM_LUA = """
local v = redis.call('GET', KEYS[1])
local done = 0
if v and string.sub(v, -#ARGV[1]) == ARGV[1] then
  local head = '{"s":"prepared",'
  if string.sub(v, 1, #head) == head then
    redis.call('SET', KEYS[1], '{"s":"completed",' .. string.sub(v, #head + 1), 'KEEPTTL')
    done = 1
  elseif string.sub(v, 1, 17) == '{"s":"completed",' then
    done = 1
  end
end
-- After the write, so through pcall: a refused PUBLISH leaves the waiters to poll, never the
-- confirmation undone or the script failed halfway.
if ARGV[2] ~= '' then redis.pcall('PUBLISH', ARGV[2], ARGV[3]) end
return done
"""

# KEYS[1] record; ARGV[1] token tail. Deletes the caller's own record while it is in
# progress; a completed record is never released.
RELEASE_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local head = '{"s":"in_progress",'
if string.sub(v, 1, #head) ~= head or string.sub(v, -#ARGV[1]) ~= ARGV[1] then
  return 0
end
return redis.call('DEL', KEYS[1])
"""

# KEYS[1] record; ARGV[1] token tail. Deletes the caller's own record in either state:
# only for an owner whose database transaction did not commit after it completed.
DISCARD_LUA = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.sub(v, -#ARGV[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


# The hybrid strategy's loss check (``HYBRID_DB_CHECK = "after_loss"``, docs/hybrid.md), on
# three keys of one hash tag:
#   marker   "<run_id> <evicted_keys>": the server's, when a check last found them changed;
#            no TTL. Missing (a flush, a restart without persistence): a loss.
#   checked  exists for ``interval`` ms after the last check of the marker against INFO;
#            never written on a server that may evict (``maxmemory`` set and a
#            ``maxmemory-policy`` other than ``noeviction``): there, every claim compares.
#   suspect  exists for ``window`` ms (the records' Redis TTL) after a loss was seen.
#   mark     (a claim's only) the key's own suspect mark (``suspects.py``): the key fell back
#            to the database, or its completion did not reach Redis; read by the same MGET.
#   held     (a claim's only) the key's held mark: a claim of the key was made in Redis, and
#            its owner may have committed (it lives the lease twice and the records' Redis
#            TTL past the claim's last renewal). Found by a claim that won: the key was taken
#            over from an owner whose lease lapsed (killed after its COMMIT, before its
#            completed record reached Redis), so it is looked up in the database (verdict 3).
# A claim reads them (one MGET); only when ``checked`` is gone (at most once per
# ``interval`` per server), the marker is missing, or the caller asks (a new script
# cache: a restart or a failover; an error seen) does it run INFO and compare. A changed
# run_id (restart, failover) or eviction count (eviction, CONFIG RESETSTAT) or a missing
# marker writes ``suspect`` and the marker. 0: no loss suspected; 1: suspected; 2: seen just
# now; 3: none, but the key was taken over from a lapsed lease; -1: the check could not run
# (the reason follows: an ACL refusing INFO or MGET...).
#
# Everything after the claim's own write goes through redis.pcall: a refused command
# (INFO is in @dangerous) answers -1 instead of failing the script halfway, which would
# leave the claim written without its answer. ``suspect`` is written before the marker: a
# script that stops between them leaves the marker stale, which the next claim sees.
_LOSS_FUNCTION = """
local function failed(reply)
  if type(reply) == 'table' and reply.err then return reply.err end
  return nil
end
local function loss(km, kc, ks, window, interval, verify, mark, held)
  local m
  if mark then
    m = redis.pcall('MGET', km, kc, ks, mark, held)
  else
    m = redis.pcall('MGET', km, kc, ks)
  end
  if failed(m) then return {-1, m.err} end
  local quiet = 0
  if m[5] then quiet = 3 end
  if m[1] and m[2] and verify ~= '1' then
    if m[3] or m[4] then return {1} end
    return {quiet}
  end
  local server = redis.pcall('INFO', 'server')
  if failed(server) then return {-1, server.err} end
  local stats = redis.pcall('INFO', 'stats')
  if failed(stats) then return {-1, stats.err} end
  local memory = redis.pcall('INFO', 'memory')
  if failed(memory) then return {-1, memory.err} end
  local state = (string.match(server, 'run_id:(%x+)') or '?') .. ' '
    .. (string.match(stats, 'evicted_keys:(%d+)') or '?')
  local verdict = quiet
  if m[3] or m[4] then verdict = 1 end
  if m[1] ~= state then
    local err = failed(redis.pcall('SET', ks, '1', 'PX', window))
      or failed(redis.pcall('SET', km, state))
    if err then return {-1, err} end
    verdict = 2
  end
  -- A server that may evict (a maxmemory and a policy other than noeviction) can drop a
  -- record at any moment: it is compared at every claim, never trusted for an interval.
  local limit = tonumber(string.match(memory, 'maxmemory:(%d+)') or '0')
  local policy = string.match(memory, 'maxmemory_policy:(%S+)') or 'noeviction'
  if limit > 0 and policy ~= 'noeviction' then return {verdict} end
  local err = failed(redis.pcall('SET', kc, '1', 'PX', interval))
  if err then return {-1, err} end
  return {verdict}
end
"""

_REPLICATE = "if redis.replicate_commands then redis.replicate_commands() end\n"

# After the loss check of a claim that won: the key's held mark written (KEYS[6], ARGV[5] ms),
# read by the check before; a refused write is a check that could not run.
_HELD_FUNCTION = """
local function held(verdict)
  local err = failed(redis.pcall('SET', KEYS[6], '1', 'PX', ARGV[5]))
  if err then return {false, -1, err} end
  return {false, verdict[1], verdict[2]}
end
"""

# KEYS[1..3] marker, checked, suspect; ARGV[1] window ms, ARGV[2] interval ms, ARGV[3] '1':
# compare with INFO now. {verdict, reason}.
LOSS_LUA = (
    _REPLICATE
    + _LOSS_FUNCTION
    + """
return loss(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
"""
)

# KEYS[1] record, KEYS[2..4] marker, checked, suspect, KEYS[5] the key's suspect mark,
# KEYS[6] its held mark; ARGV[1] the in-progress record,
# ARGV[2] lease ms, ARGV[3] window ms, ARGV[4] interval ms, ARGV[5] the held mark's life in
# ms, ARGV[6] '1': compare with INFO now. The claim (SET NX PX GET) and, when won, the loss
# check (which reads the held mark) and the held mark written, in one round trip: {record}
# when not claimed, {false, verdict, reason} when claimed. Redis 7 (SET NX GET).
CLAIM_LUA = (
    _REPLICATE
    + _LOSS_FUNCTION
    + _HELD_FUNCTION
    + """
local old = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX', 'GET')
if old then return {old} end
return held(loss(KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4], ARGV[6], KEYS[5], KEYS[6]))
"""
)

# CLAIM_LUA for Redis 6, where SET cannot take NX and GET together.
CLAIM6_LUA = (
    _REPLICATE
    + _LOSS_FUNCTION
    + _HELD_FUNCTION
    + """
local old = redis.call('GET', KEYS[1])
if old then return {old} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return held(loss(KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4], ARGV[6], KEYS[5], KEYS[6]))
"""
)


@dataclass(frozen=True)
class LossCheck:
    """What the loss check says (see ``_LOSS_FUNCTION``): ``verdict`` 0 no loss suspected,
    1 suspected, 2 seen just now, 3 none but the key was taken over from a lapsed lease, -1
    the check could not run, for ``reason``."""

    verdict: int
    reason: str = ""

    @property
    def refused(self) -> bool:
        """The check could not run because the user's ACL refuses one of its commands."""
        return self.verdict < 0 and permission_denied(ResponseError(self.reason))


_slot_tags: list[str] = []


def slot_tag(slot: int) -> str:
    """A short hash tag whose Redis Cluster slot is ``slot`` (the first hexadecimal number
    that lands there; the table of all 16 384 is built once per process)."""
    if not _slot_tags:
        tags: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        missing = REDIS_CLUSTER_HASH_SLOTS
        number = 0
        while missing:
            tag = f"{number:x}"
            found = key_slot(tag.encode())
            if tags[found] is None:
                tags[found] = tag
                missing -= 1
            number += 1
        _slot_tags[:] = [t or "" for t in tags]
    return _slot_tags[slot]


def permission_denied(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command, key or channel to this user (its ACL):
    ``NOPERM``, or inside a script on Redis 7.0 "The user executing the script can't run
    this command" / "can't access at least one of the keys"."""
    if isinstance(exc, NoPermissionError):
        return True
    text = str(exc)
    return isinstance(exc, ResponseError) and (
        "NOPERM" in text or "The user executing the script can't" in text
    )


class LossCheckDenied(RedisUnavailable):
    """The user's ACL refuses a command of the loss check (``INFO``, ``MGET``; see
    docs/redis.md for the ACL it needs)."""


def token_tail(token: str) -> str:
    """How a record held by ``token`` ends."""
    return ',"t":' + _string(token) + "}"


def _ms(value: float) -> int:
    """Milliseconds for PX/PEXPIRE: at least 1."""
    return max(int(value), 1)


def to_ms(seconds: float) -> int:
    """A lease or TTL in seconds as milliseconds for the store: at least 1."""
    return _ms(seconds * 1000)


class RedisStore:
    """Claim, renew, complete, release and read records; thread-safe, one per client."""

    def __init__(self, client: RedisClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._renew = client.register_script(RENEW_LUA)
        self._complete = client.register_script(COMPLETE_LUA)
        self._confirm = client.register_script(CONFIRM_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._discard = client.register_script(DISCARD_LUA)
        self._loss = client.register_script(LOSS_LUA)
        self._claim_checking = client.register_script(CLAIM_LUA)
        self._claim6_checking = client.register_script(CLAIM6_LUA)
        # SET ... NX GET needs Redis 7; None: not known yet.
        self._set_nx_get: bool | None = None
        #: The next loss check compares the marker with INFO whatever ``checked`` says: at
        #: the first claim of the process, and after Redis failed to answer (a restart or
        #: a failover may be why). Also when the server had to load the claim script again.
        self.verify_due = True
        #: When (``time.monotonic()``) the user's ACL last refused the loss check; None:
        #: never. The hybrid strategy looks every new key up in the database meanwhile.
        self.loss_check_refused_at: float | None = None
        #: When the hybrid strategy last logged a loss at WARNING (once a minute).
        self.loss_reported_at: float | None = None

    # keys

    def record_key(self, scope: str, key: str) -> str:
        return f"{self.prefix}:{{{key_digest(scope, key)}}}:rec"

    def held_key(self, scope: str, key: str) -> str:
        """The key's held mark (``_LOSS_FUNCTION``), in its record's hash slot."""
        return f"{self.prefix}:{{{key_digest(scope, key)}}}:own"

    def suspect_key(self, scope: str, key: str) -> str:
        """The key's suspect mark (``suspects.py``), in its record's hash slot."""
        return f"{self.prefix}:{{{key_digest(scope, key)}}}:sus"

    def put_suspects(self, marks: list[tuple[str, str, float]]) -> None:
        """Write the suspect mark of each ``(scope, key, seconds)``, living ``seconds``: one
        pipeline (on a Cluster, one per node)."""
        if not marks:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for scope, key, seconds in marks:
                pipe.set(self.suspect_key(scope, key), b"1", px=_ms(seconds * 1000))
            pipe.execute()
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc

    @property
    def wake_channel(self) -> str:
        """The pub/sub channel that wakes waiting duplicates (``WAIT``)."""
        return f"{self.prefix}:django_idempotency"

    def notify(self, scope: str, key: str) -> None:
        """Wake the key's waiting duplicates in every process: one ``PUBLISH`` of the
        digest that names the record."""
        try:
            self.client.publish(self.wake_channel, key_digest(scope, key))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc

    # operations

    def claim(
        self, scope: str, key: str, fingerprint: str, token: str, lease_ms: int
    ) -> tuple[bool, RedisRecord | None]:
        """Claim the key for ``token`` for ``lease_ms``.

        ``(True, None)``: claimed. ``(False, record)``: someone holds or completed
        it. ``(False, None)``: it was held, but vanished before it could be read
        (the caller may try again).
        """
        name = self.record_key(scope, key)
        value = encode_record(RedisRecord(IN_PROGRESS, fingerprint, token, None))
        try:
            if self._set_nx_get is not False:
                try:
                    old = self.client.set(name, value, nx=True, px=_ms(lease_ms), get=True)
                except ResponseError as exc:
                    if "syntax" not in str(exc).lower():
                        raise
                    self._set_nx_get = False  # Redis < 7: NX and GET together is a syntax error
                else:
                    self._set_nx_get = True
                    if old is None:
                        return True, None
                    return False, decode_record(old)  # type: ignore[arg-type]
            if self.client.set(name, value, nx=True, px=_ms(lease_ms)):
                return True, None
            old = self.client.get(name)
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc
        return False, None if old is None else decode_record(old)

    def loss_keys(self, tag: str = "hybrid") -> tuple[str, str, str]:
        """The loss check's marker, ``checked`` and ``suspect`` keys (``_LOSS_FUNCTION``),
        under the hash tag ``tag``."""
        base = f"{self.prefix}:{{{tag}}}:"
        return base + "loss", base + "checked", base + "suspect"

    @property
    def cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    def loss_keys_for(self, scope: str, key: str) -> tuple[str, str, str]:
        """The loss keys that answer for the record of (scope, key): the server's on a single
        node; on a Redis Cluster those of the record's hash slot (each slot moves, fails over
        and is flushed with its node, and a script's keys must share one slot)."""
        if not self.cluster:
            return self.loss_keys()
        return self.loss_keys(slot_tag(key_slot(key_digest(scope, key).encode())))

    def claim_checking_loss(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        token: str,
        lease_ms: int,
        *,
        loss_keys: tuple[str, str, str],
        window_ms: int,
        interval_ms: int,
        held_ms: int,
    ) -> tuple[bool, RedisRecord | None, LossCheck]:
        """:meth:`claim`, and when won, the loss check of ``loss_keys`` and of the key's
        suspect and held marks, and the held mark written for ``held_ms``, in one script (one
        round trip; the keys must share the record's Cluster slot). The check says nothing
        (verdict 0) when the key was not claimed."""
        value = encode_record(RedisRecord(IN_PROGRESS, fingerprint, token, None))
        keys = [
            self.record_key(scope, key),
            *loss_keys,
            self.suspect_key(scope, key),
            self.held_key(scope, key),
        ]
        args = [value, _ms(lease_ms), _ms(window_ms), _ms(interval_ms), _ms(held_ms)]
        reply, verified = self._run_loss_script(keys, args, claim=True)
        if reply[0] is not None:
            return False, decode_record(reply[0]), LossCheck(0)
        return True, None, self._verdict(reply[1:], verified)

    def loss_suspected(
        self, loss_keys: tuple[str, str, str], window_ms: int, interval_ms: int
    ) -> LossCheck:
        """The loss check alone (see ``_LOSS_FUNCTION``)."""
        reply, verified = self._run_loss_script(
            list(loss_keys), [_ms(window_ms), _ms(interval_ms)], claim=False
        )
        return self._verdict(reply, verified)

    def _run_loss_script(
        self, keys: list[str], args: list[Any], *, claim: bool
    ) -> tuple[Any, bool]:
        """EVALSHA of the claim (or the bare loss) script, with ARGV "verify" appended: a
        server that no longer has the script (a restart, a failover, SCRIPT FLUSH) loads it
        and is compared with INFO at once."""
        verify = self.verify_due
        script = self._loss
        if claim:
            script = self._claim6_checking if self._set_nx_get is False else self._claim_checking
        try:
            try:
                reply = self.client.evalsha(script.sha, len(keys), *keys, *args, int(verify))
            except NoScriptError:
                verify = True
                reply = script(keys=keys, args=[*args, 1])
        except ResponseError as exc:
            if not claim or self._set_nx_get is False or "syntax" not in str(exc).lower():
                self.verify_due = True
                raise RedisUnavailable(str(exc)) from exc
            self._set_nx_get = False  # Redis < 7: the Redis 6 script from now on
            return self._run_loss_script(keys, args, claim=claim)
        except REDIS_ERRORS as exc:
            self.verify_due = True
            raise failure(exc) from exc
        return reply, verify

    def _verdict(self, reply: list[Any], verified: bool) -> LossCheck:
        verdict = int(reply[0])
        if verified and verdict >= 0:
            self.verify_due = False
        reason = reply[1] if len(reply) > 1 else b""
        return LossCheck(verdict, reason.decode() if isinstance(reason, bytes) else str(reason))

    def renew(
        self, scope: str, key: str, token: str, lease_ms: int, held_ms: int | None = None
    ) -> bool:
        """Extend the lease to ``lease_ms`` from now, only while ``token`` holds it; with
        ``held_ms``, the key's held mark to that from now as well."""
        args: list[Any] = [token_tail(token), _ms(lease_ms)]
        if held_ms is None:
            return self._run(self._renew, scope, key, args)
        keys = [self.record_key(scope, key), self.held_key(scope, key)]
        try:
            return bool(self._renew(keys=keys, args=[*args, _ms(held_ms)]))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc

    def complete(
        self,
        scope: str,
        key: str,
        token: str,
        response: StoredResponse,
        ttl_ms: int,
        *,
        prepared: bool = False,
        xid: int | None = None,
    ) -> bool:
        """Store ``response`` for ``ttl_ms``, only while ``token`` holds the key in progress.

        The record keeps the fingerprint and the token (so that the owner can still
        ``discard`` it, e.g. when its database commit fails). ``prepared``: written as
        :data:`PREPARED`, with the transaction id ``xid``, for :meth:`confirm` after COMMIT.
        """
        args: list[Any] = [token_tail(token), encode_response(response), _ms(ttl_ms)]
        if prepared:
            args += [PREPARED, "" if xid is None else f',"x":{int(xid)}']
        return self._run(self._complete, scope, key, args)

    def confirm(self, scope: str, key: str, token: str, *, notify: bool = False) -> bool:
        """The prepared record of ``token`` made completed (its COMMIT landed), and with
        ``notify`` the key's waiters woken (:meth:`notify`) in the same script: one round
        trip. Whether the record is completed under ``token`` now."""
        channel = self.wake_channel if notify else ""
        args = [token_tail(token), channel, key_digest(scope, key)]
        return self._run(self._confirm, scope, key, args)

    def release(self, scope: str, key: str, token: str) -> bool:
        """Delete the record, only while it is in progress under ``token``."""
        return self._run(self._release, scope, key, [token_tail(token)])

    def discard(self, scope: str, key: str, token: str) -> bool:
        """Delete the record whatever its state, only when it carries ``token``: undoes a
        completion whose database transaction did not commit."""
        return self._run(self._discard, scope, key, [token_tail(token)])

    def put_completed(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        response: StoredResponse,
        ttl_ms: int,
        token: str | None = None,
    ) -> None:
        """Write a completed record unconditionally (refilling Redis from another store).

        Without ``token`` the record gets a fresh random one, so that no claim can
        release it."""
        record = RedisRecord(COMPLETED, fingerprint, token or new_token(), response)
        value = encode_record(record)
        try:
            self.client.set(self.record_key(scope, key), value, px=_ms(ttl_ms))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc

    def get(self, scope: str, key: str) -> RedisRecord | None:
        """The record, or None: one ``GET``."""
        try:
            raw = self.client.get(self.record_key(scope, key))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc
        return None if raw is None else decode_record(raw)

    def pttl(self, scope: str, key: str) -> int:
        """Milliseconds the record still lives; -2 when absent (``PTTL``)."""
        try:
            return int(self.client.pttl(self.record_key(scope, key)))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc

    def _run(self, script: Any, scope: str, key: str, args: list[Any]) -> bool:
        try:
            return bool(script(keys=[self.record_key(scope, key)], args=args))
        except REDIS_ERRORS as exc:
            raise failure(exc) from exc


_stores: dict[tuple[int, str], RedisStore] = {}
#: The store for the current settings; dropped when IDEMPOTENCY or CACHES change.
_current: list[RedisStore] = []
#: What every key prefix is followed by while a test keeps its records apart
#: (``django_idempotency.testing.isolated_store``); "" otherwise.
_isolation = [""]
#: Under a test runner, what names the suffix of the running test's records when no
#: :func:`isolate` is in force ("" outside a test): ``django_idempotency.testing.testcases``.
_isolation_source: list[Callable[[], str]] = []
#: The suffixes a store was made for since :func:`used` last asked (what a test's
#: clean-up needs to delete; a test that never reached Redis needs no SCAN).
_suffixes_used: set[str] = set()


def isolate(suffix: str) -> str:
    """From now on the store's prefix is ``REDIS_KEY_PREFIX`` followed by ``suffix``, ""
    to stop, whatever the settings become meanwhile; returns the previous suffix. For
    tests (process-wide, as settings are)."""
    with _clients_lock:
        previous, _isolation[0] = _isolation[0], suffix
        _current.clear()
    return previous


def isolate_by(source: Callable[[], str] | None) -> None:
    """From now on, when no :func:`isolate` is in force, the prefix is followed by what
    ``source()`` returns at each :func:`get_store` (None: nothing). For a test runner."""
    with _clients_lock:
        _isolation_source[:] = [] if source is None else [source]
        _current.clear()


def used(suffix: str) -> bool:
    """Whether a store was made for ``suffix`` since the last call for it (which forgets)."""
    with _clients_lock:
        found = suffix in _suffixes_used
        _suffixes_used.discard(suffix)
    return found


def get_store() -> RedisStore:
    """The store for the configured client and ``REDIS_KEY_PREFIX`` (one per process;
    followed by a test's suffix during :func:`isolate` or under :func:`isolate_by`).

    Remembered until ``IDEMPOTENCY`` or ``CACHES`` change (``setting_changed``, as sent
    by ``override_settings``) or :func:`reset_clients` is called.
    """
    if _current and not _isolation_source:
        return _current[0]
    client = get_client()
    suffix = _isolation[0] or (_isolation_source[0]() if _isolation_source else "")
    prefix = conf.REDIS_KEY_PREFIX + suffix
    ident = (id(client), prefix)
    with _clients_lock:
        if suffix:
            _suffixes_used.add(suffix)
        store = _stores.get(ident)
        if store is None or store.client is not client:
            store = _stores[ident] = RedisStore(client, prefix)
        _current[:] = [store]
    return store


def _forget_current(*, setting: str, **kwargs: Any) -> None:
    if setting in {"IDEMPOTENCY", "CACHES"}:
        _current.clear()


setting_changed.connect(_forget_current, dispatch_uid="django_idempotency.strategies.redis.store")
