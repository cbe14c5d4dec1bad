"""What a Redis command that failed did: nothing (*not done*) or perhaps everything (*unknown*).

A command that never left the client (the connection was refused, timed out while it was
being opened, or the server refused the TLS handshake or the login: anything raised while
redis-py was opening the connection) did nothing, and neither did one the server
answered with an error (``ResponseError``: a script, a command or a key it refused). Any
other failure came after the command was sent, or may have: a reply that timed out, a
connection closed or reset while the command was on its way or its reply was. Such a
command may have been applied, so its outcome is *unknown*: the strategies never take it
for "not claimed" (see docs/how-it-works.md, "A store that does not answer").
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import PurePath
from typing import TypeVar

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ConnectionError,
    MaxConnectionsError,
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


#: redis-py's functions that open a connection (the socket, TLS, the login, ``HELLO``,
#: ``CLIENT SETINFO``) before a command is written to it.
CONNECTING = frozenset(
    {"connect", "connect_check_health", "_connect", "on_connect", "on_connect_check_health"}
)


def while_connecting(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while redis-py was opening the connection the command was
    to be sent on (a TLS handshake the server refused fails on the first read of
    ``on_connect``, as a reset that reads like a lost reply): nothing was sent then."""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = PurePath(frame.filename)
        if frame.name in CONNECTING and path.name == "connection.py" and "redis" in path.parts:
            return True
    return False


def not_sent(exc: BaseException) -> bool:
    """Whether ``exc`` proves the command did nothing (see the module's docstring)."""
    if isinstance(exc, NOT_DONE) or while_connecting(exc):
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


__all__ = ["RedisOutcomeUnknown", "RedisUnavailable", "failure", "not_sent", "resend_once"]
