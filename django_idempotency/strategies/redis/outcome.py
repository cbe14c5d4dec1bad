"""What a Redis command that failed did: nothing (*not done*) or perhaps everything (*unknown*).

A command that never left the client (the connection was refused, timed out or failed while it
was being opened, or the server refused the login) did nothing, and neither did one the server
answered with an error (``ResponseError``: a script, a command or a key it refused). Any
other failure came after the command was sent, or may have: a reply that timed out, a
connection closed or reset while the command was on its way or its reply was. Such a
command may have been applied, so its outcome is *unknown*: the strategies never take it
for "not claimed" (see docs/how-it-works.md, "A store that does not answer").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ConnectionError,
    MaxConnectionsError,
    RedisError,
    ResponseError,
    TimeoutError,
)

logger = logging.getLogger("django_idempotency")

T = TypeVar("T")


class RedisUnavailable(Exception):
    """Redis could not be reached, timed out, or the cluster is down; ``__cause__`` says why.
    As such (not :class:`RedisOutcomeUnknown`): the command was not applied."""


class RedisOutcomeUnknown(RedisUnavailable):
    """The command may have been applied: it was sent (or may have been) and no reply came
    (a timeout, a connection lost mid-command)."""


#: Errors raised before a command is sent, or that are the server's answer: nothing done.
NOT_DONE: tuple[type[BaseException], ...] = (
    ResponseError,  # the server answered: the command (or the script) was refused
    AuthenticationError,  # the login, before any command
    AuthorizationError,
    BusyLoadingError,  # the server answered LOADING
    MaxConnectionsError,  # the client's pool had no connection to send it on
)


#: Where redis-py's client code lives: a failure raised in its functions that hand out a
#: connection, open it, log in and check its health, which all run before the command is
#: written (a pooled connection found closed is opened again inside them).
_REDIS_PACKAGE = os.path.dirname(redis.__file__) + os.sep
_CONNECTING = frozenset(
    {
        "get_connection",  # the pool's: a command is written only once it has returned
        "ensure_connection",
        "connect",
        "_connect",
        "connect_check_health",
        "on_connect",
        "on_connect_check_health",
        "check_health",
    }
)


def _frames(exc: BaseException) -> list[FrameType]:
    """The frames ``exc`` was raised through, from where it was caught to where it rose."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _while_connecting(frames: list[FrameType]) -> bool:
    """Whether an error raised through ``frames`` was raised while redis-py opened the
    connection (a refused or unanswered connect, a TLS handshake, the login), before the
    command was written."""
    return any(
        frame.f_code.co_name in _CONNECTING and frame.f_code.co_filename.startswith(_REDIS_PACKAGE)
        for frame in frames
    )


def _attempts(exc: BaseException) -> Iterator[tuple[BaseException, list[FrameType]]]:
    """``exc`` and the Redis errors it was raised while handling, each with the frames it
    rose through: redis-py's translation of a socket error (caught in a frame ``exc`` rose
    through too, so it shares those frames), and the earlier attempts of a client's own
    retries (the Cluster client retries a command on a refreshed connection), whose commands
    may have been sent although the last attempt's never was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    outer: list[FrameType] = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current is exc or isinstance(current, (RedisError, RedisOutcomeUnknown)):
            own = _frames(current)
            if own and own[0] in outer:
                own = outer[: outer.index(own[0])] + own
            outer = own
            yield current, own
        current = current.__cause__ or current.__context__


def not_sent(exc: BaseException) -> bool:
    """Whether ``exc`` proves the command did nothing (see the module's docstring): it,
    and every earlier attempt it was raised while handling, failed before a command left."""
    return all(_attempt_not_sent(attempt, frames) for attempt, frames in _attempts(exc))


def _attempt_not_sent(exc: BaseException, frames: list[FrameType]) -> bool:
    if isinstance(exc, RedisOutcomeUnknown):
        return False
    if isinstance(exc, NOT_DONE) or _while_connecting(frames):
        return True
    text = str(exc)
    # redis-py's connect(): "Timeout connecting to server", "Error 111 connecting to
    # 127.0.0.1:6379. Connection refused." A failure once connected says "reading from" or
    # "writing to" instead.
    if isinstance(exc, TimeoutError):
        return text.startswith("Timeout connecting")
    if isinstance(exc, ConnectionError):
        return " connecting to " in text or text.startswith("Error connecting to ")
    return False


def failure(exc: BaseException) -> RedisUnavailable:
    """The error to raise (``from exc``) for a Redis command that raised ``exc``:
    :class:`RedisUnavailable` when nothing was done, :class:`RedisOutcomeUnknown` otherwise."""
    kind = RedisUnavailable if not_sent(exc) else RedisOutcomeUnknown
    return kind(str(exc) or type(exc).__name__)


def resend_once(send: Callable[[], T], what: str) -> T:
    """``send()``, and once more when its outcome was unknown: the same command, with the same
    claim token, on a fresh connection (redis-py drops a connection whose command failed), so
    that a command applied the first time finds its own work done (the scripts answer so).
    :class:`RedisOutcomeUnknown` when the second one fails as well, in whatever way: the
    first one's outcome is still unknown."""
    try:
        return send()
    except RedisOutcomeUnknown as first:
        logger.info("the outcome of the Redis %s is unknown (%s); sending it again", what, first)
        try:
            return send()
        except RedisUnavailable as again:
            raise RedisOutcomeUnknown(f"{first}; sent again: {again}") from again


class ClusterClient(RedisCluster):
    """A Redis Cluster client that sends a command again only when the first try did
    nothing (:func:`not_sent`): a primary that failed over refused the connection, and the
    second try goes to its replacement (the client refreshes the slots before it).

    redis-py's own retry sends again after any connection error or timeout, and when the
    second try then fails while connecting (a primary that hangs: its kernel accepts, the
    login is never answered), its error is all the caller sees: the first try's command,
    which the server may have read and will apply once it runs, passes for one never sent.
    So the client is built without retries of its own (``Retry(NoBackoff(), 0)``) and a
    failed command whose outcome is unknown is raised as it is."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except (ConnectionError, TimeoutError) as first:
            if not not_sent(first):
                raise
        return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


__all__ = [
    "ClusterClient",
    "RedisOutcomeUnknown",
    "RedisUnavailable",
    "failure",
    "not_sent",
    "resend_once",
]
