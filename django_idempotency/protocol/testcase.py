"""The library's post-commit work inside a ``TestCase``, with no ``on_commit`` callback.

In a ``TestCase`` nothing commits: the test's own blocks (``_from_testcase``) are rolled
back at its end, and a block of the project's inside them (``ATOMIC_REQUESTS``, an
``atomic()`` around the request) ends with a ``RELEASE SAVEPOINT`` where production
COMMITs. A callback registered with ``on_commit`` there is one more in the test's
``captureOnCommitCallbacks()``, so :func:`defer_to_release` keeps the work on the
connection instead and runs it when that savepoint is released, with ``on_commit``'s own
rules: dropped when a savepoint it was registered under, or the transaction, rolls back.
(Outside a ``TestCase`` the lifecycle registers its one ``on_commit`` callback.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import transactions

#: The connection's attribute with the work waiting for a release.
PENDING = "_django_idempotency_pending_release"


@dataclass(eq=False)
class _Pending:
    trigger: str  # the savepoint whose release is the test's COMMIT
    sids: set[str]  # the savepoints it was registered under, as on_commit records them
    link: Any  # the DB-API connection: a reconnect (new savepoint names) drops it
    work: Callable[[], None] = field(repr=False)


def defer_to_release(connection: Any, sid: str, work: Callable[[], None]) -> None:
    """Run ``work`` when savepoint ``sid`` is released (see the module doc)."""
    _watch(connection)
    sids = transactions.open_savepoints(connection)
    pending = connection.__dict__.setdefault(PENDING, [])
    pending.append(_Pending(sid, sids, connection.connection, work))


def _watch(connection: Any) -> None:
    """Wrap the connection's savepoint and rollback methods (once per connection object)."""
    if PENDING in connection.__dict__:
        return
    release, to_savepoint, rollback = (
        connection.savepoint_commit,
        connection.savepoint_rollback,
        connection.rollback,
    )

    def savepoint_commit(sid: str) -> None:
        release(sid)
        _settle(connection, lambda p: p.trigger == sid, run=True)

    def savepoint_rollback(sid: str) -> None:
        try:
            to_savepoint(sid)
        finally:
            _settle(connection, lambda p: sid in p.sids, run=False)

    def rollback_all() -> None:
        try:
            rollback()
        finally:
            _settle(connection, lambda p: True, run=False)

    connection.savepoint_commit = savepoint_commit
    connection.savepoint_rollback = savepoint_rollback
    connection.rollback = rollback_all


def _settle(connection: Any, matches: Callable[[_Pending], bool], *, run: bool) -> None:
    pending: list[_Pending] = connection.__dict__.get(PENDING, [])
    link = connection.connection
    due = [p for p in pending if matches(p) or p.link is not link]
    if not due:
        return
    pending[:] = [p for p in pending if all(p is not d for d in due)]
    if run:
        for item in due:
            if item.link is link:  # a stale one (from before a reconnect) is only dropped
                item.work()  # after_commit(): never raises
