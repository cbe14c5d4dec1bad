"""The outcome of a transaction, asked after the fact: did its COMMIT land?

The ``redis`` strategy writes its completion to Redis before the view's transaction commits
(``prepared``, with this transaction's id), and confirms it once COMMIT has returned. A
retry that finds a completion still prepared (its owner was killed between the two, or its
COMMIT's answer never came: ``DATABASE_TIMEOUT``) asks the database what became of that
transaction, on PostgreSQL from its commit log (``txid_status``), which answers for any
connection's transaction, a dead one's too, until it is older than the log keeps (about two
billion transactions). Elsewhere nothing can be asked: the outcome stays unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .deadline import bounded
from .statements import features_of

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The transaction id of a transaction that has written nothing: there is nothing its
#: COMMIT could make durable or lose.
NOTHING_WRITTEN = 0

COMMITTED = "committed"
ABORTED = "aborted"
IN_PROGRESS = "in progress"
#: The database cannot tell (another vendor, or a transaction too old for its log).
UNKNOWN = "unknown"


def transaction_id(connection: BaseDatabaseWrapper) -> int | None:
    """The id of ``connection``'s open transaction; :data:`NOTHING_WRITTEN` when it has
    written nothing (none is assigned: that would make its COMMIT a write); None where the
    database cannot tell a transaction's outcome later. Raises ``DatabaseError``."""
    sql = features_of(connection).transaction_id_sql
    if not sql:
        return None
    with bounded(connection), connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def transaction_outcome(connection: BaseDatabaseWrapper, xid: int | None) -> str:
    """What became of transaction ``xid``: :data:`COMMITTED`, :data:`ABORTED` (rolled back,
    or its session ended before COMMIT), :data:`IN_PROGRESS` or :data:`UNKNOWN`. Asked on
    ``connection`` in its own statement (outside any transaction of the caller's), within
    ``DATABASE_TIMEOUT``. Raises ``DatabaseError``."""
    sql = features_of(connection).transaction_status_sql
    if xid is None or not sql:
        return UNKNOWN
    with bounded(connection), connection.cursor() as cursor:
        cursor.execute(sql, [xid])
        row = cursor.fetchone()
    status = None if row is None else row[0]
    return status if status in (COMMITTED, ABORTED, IN_PROGRESS) else UNKNOWN
