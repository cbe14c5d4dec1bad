"""Every statement of the store compiled for one connection, and the cache that keeps them.

:class:`Statements` calls each builder once with the connection's :class:`Schema` and
dialect; :func:`statements` keeps one per ``(alias, vendor)``, so that the request path
only fills in parameters. A new statement is a builder in its family module and one line
in :meth:`Statements.__init__` (and a snapshot per vendor in ``tests/snapshots/sql/``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, models

from ...conf import conf
from ..records import READ_COLUMNS, KeyRow
from . import claim, completed, drain, fence, outbox, owner, partitioned, purge, read
from .base import BaseDialect
from .mysql import MariaDBDialect, MySQLDialect
from .outbox import OUTBOX_ADD_PARAMS
from .parts import Part
from .postgresql import PostgreSQLDialect, and_commit
from .schema import Schema
from .sqlite import SQLiteDialect
from .statement import Statement

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The dialect of each vendor; another vendor gets the base (the app's clock, standard SQL).
DIALECTS: dict[str, type[BaseDialect]] = {
    "postgresql": PostgreSQLDialect,
    "sqlite": SQLiteDialect,
    "mysql": MySQLDialect,
}


def features_of(connection: BaseDatabaseWrapper) -> type[BaseDialect]:
    """The dialect of ``connection``'s vendor family, for its features alone: without
    connecting (MariaDB and MySQL share theirs), as the checks and the request path ask."""
    return DIALECTS.get(connection.vendor, BaseDialect)


def running(strategy: str) -> list[type[BaseDialect]]:
    """The dialects a SQL strategy runs on, by vendor name (none for another strategy)."""
    return [
        DIALECTS[vendor] for vendor in sorted(DIALECTS) if strategy in DIALECTS[vendor].strategies
    ]


def dialect_for(connection: BaseDatabaseWrapper) -> type[BaseDialect]:
    """The dialect of ``connection``'s vendor; on Django's ``mysql`` backend, MariaDB's or
    MySQL's (which asks the server, so it connects)."""
    dialect = DIALECTS.get(connection.vendor, BaseDialect)
    if dialect is MySQLDialect and getattr(connection, "mysql_is_mariadb", False):
        return MariaDBDialect
    return dialect


def clock_in_sql(connection: BaseDatabaseWrapper) -> bool:
    """Whether the statements on ``connection`` take the time from the database server's
    clock (:attr:`BaseDialect.clock_in_sql`): on PostgreSQL they do, on SQLite the
    database's clock is the app server's."""
    return dialect_for(connection).clock_in_sql


def database(using: str | None, bound: str | None) -> str:
    """The alias a manager method runs on: ``using=``, else the one its manager or queryset
    is bound to (``.using()``, ``db_manager()``), else ``"default"``."""
    return using or bound or DEFAULT_DB_ALIAS


def _models() -> tuple[type[models.Model], type[models.Model]]:
    """IdempotencyKey and IdempotencyOutbox, from the app registry (the store does not
    import the models module, which imports the store's managers)."""
    config = apps.get_containing_app_config(__name__)
    assert config is not None
    return config.get_model("IdempotencyKey"), config.get_model("IdempotencyOutbox")


def _converters(
    model: type[models.Model], connection: BaseDatabaseWrapper, columns: tuple[str, ...]
) -> list[tuple[list[Any], Any]]:
    """What SQLCompiler.get_converters() gives the ORM for each column: the backend's
    converters, then the field's from_db_value."""
    fields = {f.name: f for f in model._meta.concrete_fields}
    converters = []
    for name in columns:
        col = fields[name].get_col(model._meta.db_table)
        converters.append(
            (connection.ops.get_db_converters(col) + col.get_db_converters(connection), col)
        )
    return converters


class Statements:
    """The SQL of IdempotencyKey and of its outbox on one backend, built once.

    Parameters are adapted with the model's own fields, through
    ``get_db_prep_value(prepared=True)``: every value here is made by the managers and
    already has the field's Python type (a ``uuid.UUID``, a dict, bytes, str), so the
    generic ``get_prep_value`` step of ``get_db_prep_save`` would only repeat checks; the
    backend's adaptation (``connection.ops``) is still applied. Times come from the
    database's clock where the dialect has one (:attr:`BaseDialect.clock_in_sql`).
    """

    def __init__(
        self,
        connection: BaseDatabaseWrapper,
        dialect: type[BaseDialect] | None = None,
        *,
        partitioned: bool | None = None,
    ) -> None:
        keys, outbox_model = _models()
        self.dialect = d = dialect or dialect_for(connection)
        #: Whether the statements are those of a key table partitioned by expiry
        #: (:mod:`.partitioned`; ``PARTITION_INTERVAL`` on PostgreSQL by default).
        self.partitioned = is_partitioned(d) if partitioned is None else partitioned
        self.schema = s = Schema(connection, d, keys, outbox_model)
        self.table = str(keys._meta.db_table)
        self.fields = s.fields
        self._purge: dict[tuple[bool, bool], Statement] = {}
        fast = d.async_commit
        #: The claim in autocommit, the request path's: a transaction of its own, committed
        #: asynchronously where the dialect can. In a transaction (the session nested in an
        #: outer ``atomic``) the commit is the caller's, and keeps its durability.
        self.claim = s.statement(*claim.claim(s, fast))
        self.claim_in_transaction = s.statement(*claim.claim(s, "")) if fast else self.claim
        self.take_over = s.statement(*claim.take_over(s, fast))
        self.take_over_in_transaction = (
            s.statement(*claim.take_over(s, "")) if fast else self.take_over
        )
        self._upserts(s)
        self.read = s.statement(*read.read(s))
        self.read_live = s.statement(*read.read_live(s))
        self.claim_read = s.statement(*read.claim_read(s))
        self.outbox_lookup = s.statement(*read.outbox_lookup(s))
        self.complete = s.statement(*owner.complete(s))
        self.renew = s.statement(*owner.renew(s))
        self.release = s.statement(*owner.release(s))
        self.fence_read = s.statement(*fence.fence_read(s))
        self.fence_delete = s.statement(*fence.fence_delete(s))
        #: The outbox row's fields, whose ``get_db_prep_save`` adapts its values (not its
        #: times: the database's clock writes them).
        self.outbox_add_fields = [s.outbox_fields[name] for name in OUTBOX_ADD_PARAMS]
        self._commit_forms(s)
        if self.partitioned:
            self._partitioned(s)
        self._keys = keys
        self._connection = connection
        #: The claim's empty ``response_headers``, adapted once (the adapter's wrapper is
        #: only read when the statement is sent).
        self.no_headers = self.prep("response_headers", {}, connection)

    def _upserts(self, s: Schema) -> None:
        """The conditional upserts, where the dialect has them (None elsewhere): the
        completed record over an expired one (``advisory_lock``), the outbox row over an
        expired one (``hybrid``), and the outbox drain's batch as one statement."""
        self.store: Statement | None = None
        self.outbox_add: Statement | None = None
        if s.dialect.upserts:
            self.store = s.statement(*completed.store(s))
            self.outbox_add = s.statement(*outbox.outbox_add(s))
        #: One batch of the outbox drain, without and with ``hold_partial``; on a
        #: partitioned key table, their first statement, and ``drain_move`` the second.
        self.drain_batch: Statement | None = None
        self.drain_batch_hold: Statement | None = None
        self.drain_move: Statement | None = None
        if s.dialect.moves_in_statement:
            self.drain_batch = s.statement(*drain.drain_batch(s, hold=False))
            self.drain_batch_hold = s.statement(*drain.drain_batch(s, hold=True))

    def _commit_forms(self, s: Schema) -> None:
        """The statements that fold more into one query where the dialect can: a write and
        the COMMIT of its transaction (:func:`and_commit`), the commit guard and the outbox
        insert; None elsewhere."""
        d = s.dialect
        #: The completion and the COMMIT of the view's transaction in one round trip;
        #: fails when the fence matched no row. The same for ``store`` (advisory_lock's).
        self.complete_and_commit: Statement | None = None
        self.store_and_commit: Statement | None = None
        if d.commits_in_statement:
            self.complete_and_commit = s.statement(
                *and_commit([*owner.complete(s), " RETURNING 1"])
            )
            self.store_and_commit = s.statement(*and_commit(completed.store(s)))
        #: The hybrid strategy's commit guard folded into its outbox insert, and the same
        #: with the COMMIT; elsewhere ``outbox_add`` follows ``fence_read``/``fence_delete``.
        self.outbox_add_fenced: Statement | None = None
        self.outbox_add_fenced_and_commit: Statement | None = None
        if d.fences_in_outbox_add:
            ctes = outbox.fence_ctes(s)
            add = outbox.outbox_add_fenced(s)
            self.outbox_add_fenced = s.statement("WITH ", *ctes, " ", *add)
            self.outbox_add_fenced_and_commit = s.statement(*and_commit(add, cte=ctes))

    def _partitioned(self, s: Schema) -> None:
        """The statements of a key table partitioned by expiry, in place of the plain
        table's: the claim and the takeover after the key's advisory lock, the renewal that
        keeps the expiry a lease ahead, advisory_lock's completed record without ``ON
        CONFLICT (scope, key)``."""

        def locked(parts: list[Part]) -> Statement:
            return partitioned.LockedStatement(s.dialect, s.fields["expires_at"], *parts)

        fast = s.dialect.async_commit
        self.claim = locked(partitioned.claim(s, fast))
        self.claim_in_transaction = locked(partitioned.claim(s, ""))
        self.take_over = locked(partitioned.take_over(s, fast))
        self.take_over_in_transaction = locked(partitioned.take_over(s, ""))
        self.renew = s.statement(*partitioned.renew(s))
        self.store = s.statement(*partitioned.store(s))
        self.store_and_commit = s.statement(
            *and_commit(partitioned.store_insert(s), cte=partitioned.store_ctes(s))
        )
        #: The outbox drain's batch as two statements (the first takes the keys' locks).
        self.drain_batch = s.statement(*drain.lock_batch(s, hold=False))
        self.drain_batch_hold = s.statement(*drain.lock_batch(s, hold=True))
        self.drain_move = s.statement(*drain.move_locked(s))

    def named(self) -> dict[str, Statement]:
        """Every statement built here, by attribute name, and the purge's four forms
        (``purge_batch``, ``purge_batch_cutoff``, …): what the snapshot tests render."""
        found = {name: value for name, value in vars(self).items() if isinstance(value, Statement)}
        for cutoff in (False, True):
            for lease_cutoff in (False, True):
                suffix = ("_cutoff" if cutoff else "") + ("_lease_cutoff" if lease_cutoff else "")
                found["purge_batch" + suffix] = self.purge_batch(
                    cutoff=cutoff, lease_cutoff=lease_cutoff
                )
        return found

    @functools.cached_property
    def read_converters(self) -> list[tuple[list[Any], Any]]:
        """The converters of a read's columns, made on the first read (the backend may ask
        its server which it needs: MariaDB's native UUID)."""
        return _converters(self._keys, self._connection, READ_COLUMNS)

    def prep(self, name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
        """``value`` (already of field ``name``'s Python type) as the backend takes it."""
        return self.fields[name].get_db_prep_value(value, connection, prepared=True)

    def key_row(self, connection: BaseDatabaseWrapper, found: Any) -> KeyRow:
        """The :class:`KeyRow` of a row of :attr:`read` (or ``claim_read``, ``read_live``,
        ``outbox_lookup``), converted as the ORM converts IdempotencyKey's columns."""
        values = []
        for value, (functions, col) in zip(found[1:], self.read_converters, strict=False):
            for function in functions:
                value = function(value, col, connection)
            values.append(value)
        values.append(int(found[0]) == 0)  # from_outbox
        return KeyRow(*values)

    def purge_batch(self, *, cutoff: bool, lease_cutoff: bool) -> Statement:
        """One batch of the purge (:func:`~django_idempotency.store.sql.purge.purge_batch`),
        with parameters for ``cutoff`` and ``lease_cutoff`` when they are given, else the
        database's now; each form built on first use."""
        built = self._purge.get((cutoff, lease_cutoff))
        if built is None:
            parts = purge.purge_batch(self.schema, cutoff=cutoff, lease_cutoff=lease_cutoff)
            built = self._purge[(cutoff, lease_cutoff)] = self.schema.statement(*parts)
        return built


def is_partitioned(dialect: type[BaseDialect]) -> bool:
    """Whether the key table is partitioned by expiry on a database of ``dialect``:
    ``PARTITION_INTERVAL`` is set, and the database is PostgreSQL (the checks refuse it
    elsewhere)."""
    return conf.PARTITION_INTERVAL is not None and dialect is PostgreSQLDialect


_statements: dict[tuple[str, str, bool], Statements] = {}


def statements(connection: BaseDatabaseWrapper) -> Statements:
    """The :class:`Statements` of ``connection``'s database, built on first use (again
    when ``PARTITION_INTERVAL`` is set or unset)."""
    cache_key = (connection.alias, connection.vendor, conf.PARTITION_INTERVAL is not None)
    built = _statements.get(cache_key)
    if built is None:
        built = _statements[cache_key] = Statements(connection)
    return built
