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
from collections.abc import Callable
from typing import TypeVar

import redis
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


#: Where redis-py's client code lives: a failure raised in its functions that open a
#: connection, log in and check its health, which all run before the command is written.
_REDIS_PACKAGE = os.path.dirname(redis.__file__) + os.sep
_CONNECTING = frozenset(
    {
        "connect",
        "_connect",
        "connect_check_health",
        "on_connect",
        "on_connect_check_health",
        "check_health",
    }
)


def _while_connecting(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while redis-py opened the connection (a refused or
    unanswered connect, a TLS handshake, the login), before the command was written."""
    frame = exc.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name in _CONNECTING and code.co_filename.startswith(_REDIS_PACKAGE):
            return True
        frame = frame.tb_next
    return False


def not_sent(exc: BaseException) -> bool:
    """Whether ``exc`` proves the command did nothing (see the module's docstring)."""
    if isinstance(exc, NOT_DONE) or _while_connecting(exc):
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
