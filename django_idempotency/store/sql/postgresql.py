"""PostgreSQL's dialect, and what only PostgreSQL's statements do.

Times come from ``statement_timestamp()`` (the start of the statement; not ``now()``, the
start of the transaction, which for ``complete`` is the start of the view's transaction):
app servers whose clocks disagree still agree on whether a lease is stale. The claim and
the takeover commit their own transaction asynchronously (:data:`ASYNC_COMMIT`); the
completion and the ``COMMIT`` of the view's transaction can be one query
(:func:`and_commit`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .base import BaseDialect
from .statement import NOT_STORED_MARKER

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .parts import Part

#: The one-row subquery that the claim and the takeover join, so that the transaction of
#: their autocommit statement commits without waiting for its WAL flush
#: (``synchronous_commit = off`` for that transaction only, ``set_config(…, true)``): no
#: round trip of its own. The view's transaction, which commits after it, flushes the WAL up
#: to its own commit record, the claim's included; see docs/how-it-works.md.
ASYNC_COMMIT = " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"


class PostgreSQLDialect(BaseDialect):
    vendor = "postgresql"
    display_name = "PostgreSQL"
    strategies = frozenset({"db", "advisory_lock", "hybrid"})
    notifies = True
    settles_in_view_transaction = True
    purges_in_statement = True
    time_partitions = True
    cut_on_timeout = True
    clock_in_sql = True
    now_sql = "statement_timestamp()"
    now_plus_sql = "(statement_timestamp() + make_interval(secs => %s))"
    async_commit = ASYNC_COMMIT
    commits_in_statement = True
    fences_in_outbox_add = True
    moves_in_statement = True
    # PostgreSQL 10+; txid_status() answers from the commit log (pg_xact) of the cluster.
    # A transaction that wrote nothing has no id, and is not given one (an id would make
    # its COMMIT a write: a WAL record, an id consumed towards wraparound).
    transaction_id_sql = "SELECT COALESCE(txid_current_if_assigned(), 0)"
    transaction_status_sql = "SELECT txid_status(%s)"


def and_commit(write: list[Part], cte: list[Part] | None = None) -> list[Part]:
    """``write`` (a data-modifying statement with ``RETURNING``), then ``COMMIT``, as one
    simple-protocol query: one round trip where the store and Django's COMMIT took two.

    The write runs as a CTE whose rows are counted; when it returned none, the outer
    ``SELECT`` fails with :data:`NOT_STORED_MARKER` (the ``CASE`` evaluates the failing
    branch only then: it depends on the count, so the planner cannot fold it), which
    aborts the transaction and skips the ``COMMIT``. ``cte``: CTEs of ``write`` that must
    come first (a ``WITH`` cannot nest inside a data-modifying CTE).
    """
    return [
        "WITH ",
        *(cte or []),
        ", stored AS (" if cte else "stored AS (",
        *write,
        ") SELECT CASE WHEN count(*) > 0 THEN 1 ELSE "
        f"CAST('{NOT_STORED_MARKER}' || count(*) AS integer) END FROM stored; COMMIT",
    ]


def commits_in_statement(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` can send a statement and ``COMMIT`` as one query: PostgreSQL
    through psycopg 3 with client-side binding (Django's default), which sends a query
    over the simple protocol. Server-side binding (``OPTIONS["server_side_binding"]``)
    prepares it, and one prepared statement holds one command only; psycopg2 fetches the
    last result (the COMMIT's), not the write's."""
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    factory = getattr(connection.connection, "cursor_factory", None)
    client_cursor = _client_cursor()
    return (
        client_cursor is not None
        and isinstance(factory, type)
        and issubclass(factory, client_cursor)
    )


@functools.cache
def _client_cursor() -> type | None:
    """psycopg 3's ClientCursor, None without psycopg 3 (imported on first use only)."""
    try:
        from psycopg import ClientCursor
    except ImportError:  # psycopg2 only
        return None
    return ClientCursor
