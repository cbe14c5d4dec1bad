"""What a vendor's statements say differently: the protocol of a dialect, and its defaults.

As Django's ``db/backends/`` do, the base speaks the SQL the vendors share and each vendor
module (:mod:`~django_idempotency.store.sql.postgresql`,
:mod:`~django_idempotency.store.sql.sqlite`, :mod:`~django_idempotency.store.sql.mysql` for
MariaDB and MySQL) overrides what differs. The builders of the family modules, and every
layer above the store (the lifecycle, the waiters, the purge, the checks), ask the dialect
for these fragments and features (as Django's ``features.py``), never for a vendor's name:
a new vendor is one module here and its snapshot tests.
"""

from __future__ import annotations

from typing import Protocol

from .parts import Param, Part


class Names(Protocol):
    """What a dialect reads of a ``schema.Schema``: the key table's quoted names."""

    table: str

    def col(self, name: str) -> str: ...


class BaseDialect:
    """A vendor's fragments of SQL and what its statements can do (class attributes only:
    a dialect is never instantiated, the statements are built once per connection)."""

    #: ``connection.vendor``.
    vendor = ""
    #: How the checks and errors name the database.
    display_name = "this database"
    #: The SQL strategies that run on it (the checks refuse the others: E007, E008).
    strategies: frozenset[str] = frozenset()
    #: Whether the key's waiters are woken by the database (``LISTEN``/``NOTIFY``), else
    #: they poll and are woken in-process.
    notifies = False
    #: Whether the claim's "is the key settled elsewhere?" read may be the first statement
    #: of the view's transaction; else it is read before that transaction opens (on
    #: SQLite a read fixes the snapshot, and the view's first write then fails after any
    #: other commit).
    settles_in_view_transaction = False
    #: Whether a batch of the purge is one statement of the store's own SQL; else it goes
    #: through the ORM (one ``DELETE`` with the expiry condition).
    purges_in_statement = False
    #: Whether the key table can be partitioned by expiry (``PARTITION_INTERVAL``).
    time_partitions = False
    #: Whether the ``db`` strategy's isolation level and time zone come from the
    #: connection's ``OPTIONS``, which the checks read (E033, E034).
    session_from_options = False
    #: Whether the statements take the time from the database server's clock (the SQL of
    #: :attr:`now_sql` and :attr:`now_plus_sql`), else from ``timezone.now()`` in a
    #: parameter. Every lease, expiry and purge decision is then made on that one clock.
    clock_in_sql = False
    #: The current time, in SQL (with :attr:`clock_in_sql`).
    now_sql = ""
    #: The current time plus the seconds of one ``%s`` parameter, in SQL.
    now_plus_sql = ""
    #: Joined by the claim and the takeover in autocommit, so that their own transaction
    #: commits without waiting for its flush (PostgreSQL); nothing elsewhere.
    async_commit = ""
    #: Whether a write and ``COMMIT`` can be one query (the ``*_and_commit`` statements).
    commits_in_statement = False
    #: Whether the ``hybrid`` strategy's outbox insert can fence a stale claim in the same
    #: statement (a data-modifying CTE).
    fences_in_outbox_add = False
    #: Whether a batch of the outbox drain is one statement (data-modifying CTEs and
    #: ``gen_random_uuid()``: :mod:`~django_idempotency.store.sql.drain`); elsewhere the
    #: manager reads the batch, writes the keys and deletes the rows in three.
    moves_in_statement = False
    #: Whether ``DATABASE_TIMEOUT`` bounds the library's statements (its watchdog cuts the
    #: connection's socket: :mod:`~django_idempotency.store.sql.deadline`); elsewhere the
    #: driver has a read timeout of its own.
    cut_on_timeout = False
    #: The driver's option (in ``DATABASES[...]["OPTIONS"]``) that bounds the wait for a
    #: reply where ``DATABASE_TIMEOUT`` does not (:attr:`cut_on_timeout`); "": none needed
    #: (SQLite is a file on the app server's host).
    read_timeout_option = ""
    #: The id of the connection's transaction, whose outcome :attr:`transaction_status_sql`
    #: tells afterwards, even from another connection and after its owner died; 0 when the
    #: transaction has written nothing (it has no id, and its COMMIT makes nothing
    #: durable); "": the database cannot tell it (the ``redis`` strategy's prepared
    #: completion is then unknown until confirmed: docs/redis.md).
    transaction_id_sql = ""
    #: ``committed``, ``aborted``, ``in progress`` or NULL (too old to know) for the
    #: transaction id of one ``%s`` parameter.
    transaction_status_sql = ""
    #: What a ``SELECT`` of values alone needs before its ``WHERE`` (``" FROM DUAL"``).
    from_nothing = ""
    #: Whether ``INSERT … ON CONFLICT (…) DO UPDATE … WHERE`` (a conditional upsert) is
    #: built: the completed record of ``advisory_lock`` and the ``hybrid`` outbox insert.
    upserts = True

    @classmethod
    def insert_or_nothing(cls, s: Names) -> list[Part]:
        """What ends the claim's ``INSERT``: nothing inserted when the key has a row, and a
        row with the inserted row's id when it did not (no row otherwise, or a row whose id
        is NULL). A dialect whose claim returns no row makes the claimant read its row back
        and compare the claim token."""
        return [
            f" ON CONFLICT ({s.col('scope')}, {s.col('key')}) DO NOTHING RETURNING {s.col('id')}"
        ]

    @classmethod
    def delete_first(cls, s: Names, where: list[Part], order: str, limit: Param) -> list[Part]:
        """``DELETE`` the first ``limit`` rows of IdempotencyKey by ``order`` among those
        matching ``where``, which is checked again on the row version the ``DELETE`` locks."""
        pk = s.col("id")
        return [
            f"DELETE FROM {s.table} WHERE ",
            *where,
            f" AND {pk} IN (SELECT {pk} FROM {s.table} WHERE ",
            *where,
            f" ORDER BY {order} LIMIT ",
            limit,
            ")",
        ]
