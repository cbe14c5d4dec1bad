"""Deleting expired keys, in batches of short transactions (see docs/operations.md).

The queryset half of ``IdempotencyKey.objects``: ``expired()`` and ``purgeable()`` filter
a queryset; ``delete_expired()`` and friends, used by the ``purge_expired_keys`` task, the
``purge_idempotency_keys`` command and the admin, work on the whole table of the alias of
``using=`` or ``.using()``. The reference is docs/api.md ("The model and its manager").
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar

from django.db import OperationalError, connections, models, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import conf
from .clock import DatabaseNow
from .errors import is_transient
from .sql.statement import Statement
from .sql.statements import clock_in_sql, database, features_of, statements
from .status import IN_PROGRESS

logger = logging.getLogger("django_idempotency")


def check_older_than(older_than: timedelta | None) -> None:
    """Refuse a negative ``older_than``: it would put the cutoff in the future, and the
    purge (or the partition drop) would delete keys that have not expired yet."""
    if older_than is not None and older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative (got {older_than})")


def _time(alias: str, at: datetime | None, before: timedelta | float | None = None) -> Any:
    """``at``, else the database's now (:class:`~.clock.DatabaseNow`, in UTC whatever the
    session's time zone; see :func:`clock_in_sql`), less ``before`` (seconds or a
    timedelta), for an ORM filter."""
    if isinstance(before, (int, float)):
        before = timedelta(seconds=before)
    if at is not None:
        return at - before if before else at
    if clock_in_sql(connections[alias]):
        return DatabaseNow() - before if before else DatabaseNow()
    return timezone.now() - before if before else timezone.now()


#: The in-progress keys :meth:`PurgeQuerySet.release_stuck` gives back instead of deleting:
#: a recovery point, or steps that hold anything (the mark of a remote call made before any
#: step committed, the completer's request). :func:`kept_on_release` is the same for a row.
KEPT_ON_RELEASE = Q(recovery_point__isnull=False) | Q(steps__isnull=False)


#: The keys the purge never deletes, their ``TTL`` over or not: in progress with steps
#: (:data:`KEPT_ON_RELEASE`). A step of theirs may have taken effect (a local step committed,
#: a remote call made); deleted, the key's retry would be a new request that runs those steps
#: again, and calls another service with the same downstream key, perhaps after it forgot it.
UNFINISHED = Q(status=IN_PROGRESS) & KEPT_ON_RELEASE


def kept_on_release(row: Any) -> bool:
    """Whether releasing ``row`` (an in-progress key) keeps it: :data:`KEPT_ON_RELEASE`."""
    return row.recovery_point is not None or row.steps is not None


#: How far back a released claim's lease is set: lapsed for any ``LOCK_TIMEOUT``.
RELEASED_LEASE = timedelta(days=3650)


#: How many times a batch is taken again after a transient conflict: on a partitioned key
#: table, a renewal that moved a row the batch was deleting to a later partition (SQLSTATE
#: 40001); the batch's snapshot is taken again, and the moved row, renewed, is left.
PURGE_ATTEMPTS = 3


def _delete_batch(alias: str, statement: Statement, values: dict[str, Any]) -> int:
    """One batch of the purge in its own transaction; how many rows it deleted."""
    for attempt in range(PURGE_ATTEMPTS):
        try:
            with transaction.atomic(using=alias):
                _row, deleted = statement.execute(connections[alias], values, bound=False)
            return int(deleted)
        except OperationalError as exc:
            if attempt == PURGE_ATTEMPTS - 1 or not is_transient(exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _delete_where(queryset: models.QuerySet[Any], alias: str) -> int:
    """``DELETE … WHERE`` the filters of ``queryset``, one statement; how many rows.

    Not ``queryset.delete()``: with a delete signal receiver connected to the model,
    Django's collector reads the rows, sends the signals, and deletes them by id alone,
    so that a key renewed or taken over after the read would be deleted though live. Here
    the expiry condition is checked again by the ``DELETE`` on the row it deletes, as in
    the one-statement purge, and no signals are sent (the key table has no relations).
    """
    return int(queryset._raw_delete(alias))


#: The model of the queryset: IdempotencyKey (named by the models, not imported here).
_Key = TypeVar("_Key", bound=models.Model)


class PurgeQuerySet(models.QuerySet[_Key]):
    """Expired keys, and the batched deletes of the purge."""

    _db: str | None

    def _table(self, alias: str) -> Self:
        """All the keys of database ``alias``, whatever this queryset filters."""
        return type(self)(self.model, using=alias)

    def expired(
        self,
        *,
        now: datetime | None = None,
        older_than: timedelta | None = None,
        using: str | None = None,
    ) -> Self:
        """The keys whose ``expires_at`` has passed (``older_than`` ago, when given) at
        ``now``, by default on the database's clock."""
        check_older_than(older_than)
        alias = database(using, self._db)
        return self.using(alias).filter(expires_at__lte=_time(alias, now, older_than))

    def purgeable(self, cutoff: Any, lease_cutoff: Any) -> Self:
        """Keys expired at ``cutoff``, less those in progress under a live lease, renewed
        after ``lease_cutoff`` (datetimes or expressions: the lease rule of
        :func:`~django_idempotency.store.sql.parts.lapsed`), and less those in progress
        with steps (:data:`UNFINISHED`), whatever their lease: the statements'
        :func:`~django_idempotency.store.sql.purge.purgeable`."""
        return (
            self.filter(expires_at__lte=cutoff)
            .exclude(status=IN_PROGRESS, locked_at__gt=lease_cutoff)
            .exclude(UNFINISHED)
        )

    def unfinished(self, *, older_than: timedelta | None = None, using: str | None = None) -> Self:
        """The keys in progress with steps whose ``TTL`` is over (``older_than`` ago, when
        given), on the database's clock: the purge keeps them (:data:`UNFINISHED`) until a
        retry or the completer completes them, or someone reconciles them and deletes them."""
        check_older_than(older_than)
        alias = database(using, self._db)
        cutoff = _time(alias, None, older_than)
        return self._table(alias).filter(UNFINISHED, expires_at__lte=cutoff)

    def warn_unfinished(
        self, *, older_than: timedelta | None = None, using: str | None = None
    ) -> int:
        """How many keys :meth:`unfinished` finds: after a purge with the same
        ``older_than``, those it kept (an index range the purge has just emptied of the
        rest). A warning when there are any, logged after every purge until they are
        completed or reconciled."""
        alias = database(using, self._db)
        count = self.unfinished(older_than=older_than, using=alias).count()
        if count:
            logger.warning(
                "%d idempotency keys on %r are in progress with steps and their TTL is over: "
                "the purge keeps them until a retry or the completer completes them. Look "
                "them up (IdempotencyKey.objects.unfinished()) and reconcile them "
                "(docs/steps.md, 'Keys the purge keeps')",
                count,
                alias,
                extra={"idempotency_outcome": "unfinished_kept"},
            )
        return count

    def forgettable(self, pks: list[int], *, using: str | None = None) -> Self:
        """Those of ``pks`` in progress with steps (:data:`UNFINISHED`) under a lease that
        has lapsed (its request is not running): the keys the admin deletes once someone has
        reconciled them by hand (:meth:`delete_unfinished`)."""
        alias = database(using, self._db)
        lease_cutoff = _time(alias, None, conf.LOCK_TIMEOUT)
        return self._table(alias).filter(UNFINISHED, pk__in=pks).exclude(locked_at__gt=lease_cutoff)

    def delete_unfinished(self, pks: list[int], *, using: str | None = None) -> list[_Key]:
        """Delete the :meth:`forgettable` keys of ``pks``, in one transaction that reads them
        under a row lock and deletes them with the condition checked again; the rows
        deleted. A retry with such a key is then a new request, which runs its steps
        again: only for keys reconciled by hand (docs/steps.md, "Keys the purge keeps")."""
        alias = database(using, self._db)
        with transaction.atomic(using=alias):
            rows = list(self.forgettable(pks, using=alias).select_for_update())
            if rows:
                _delete_where(self.forgettable([row.pk for row in rows], using=alias), alias)
        return rows

    def release_stuck(self, pks: list[int] | None = None, *, using: str | None = None) -> int:
        """Release in-progress keys by hand (the admin action); returns how many.

        A key without steps is deleted, so that a retry claims it afresh. A key whose
        steps committed (it has a recovery point, docs/steps.md), or whose steps record
        anything else (a remote call made before any step committed), keeps its row, its
        recovery point and its steps: only its claim is given back (a token no one holds,
        a lease that has lapsed), so that its retry takes it over at once and resumes
        after those steps instead of running them again. Either way a request that still
        holds the old token can no longer commit a step or its response."""
        queryset = self._table(database(using, self._db)).filter(status=IN_PROGRESS)
        if pks is not None:
            queryset = queryset.filter(pk__in=pks)
        alias = database(using, self._db)
        resumable = queryset.filter(KEPT_ON_RELEASE)
        given_back = 0
        for pk in list(resumable.values_list("pk", flat=True)):
            given_back += resumable.filter(pk=pk).update(
                claim_token=uuid.uuid4(), locked_at=_time(alias, None, RELEASED_LEASE)
            )
        deleted, _ = queryset.exclude(KEPT_ON_RELEASE).delete()
        return given_back + deleted

    def delete_expired(
        self,
        *,
        batch_size: int = 1000,
        older_than: timedelta | None = None,
        now: datetime | None = None,
        using: str | None = None,
        max_batches: int | None = None,
    ) -> int:
        """Delete expired keys in batches of ``batch_size``, one short transaction each.

        ``older_than`` keeps keys that expired less than that long ago. Expiry is
        judged at ``now``, by default on the database's clock. Returns the number of
        rows deleted.
        """
        check_older_than(older_than)
        cutoff = None
        if now is not None:
            cutoff = now - older_than if older_than else now
        total = 0
        for _count in self.iter_delete_expired(
            batch_size=batch_size,
            cutoff=cutoff,
            older_than=older_than,
            using=using,
            max_batches=max_batches,
        ):
            total += _count
        return total

    def iter_delete_expired(
        self,
        *,
        batch_size: int,
        cutoff: datetime | None = None,
        using: str | None = None,
        max_batches: int | None = None,
        lease_cutoff: datetime | None = None,
        older_than: timedelta | None = None,
    ) -> Iterator[int]:
        """Yield the number of rows deleted by each batch (for progress reporting).

        Deletes the keys that expired before ``cutoff``; by default, before the
        database's now (:func:`clock_in_sql`, taken again by each batch) less
        ``older_than``. A key still in progress under a live lease (renewed after
        ``lease_cutoff``, by default ``LOCK_TIMEOUT`` before the database's now) is never
        deleted, however old it is: its request is running and will complete it.

        On PostgreSQL and SQLite each batch is one statement in its own short
        transaction, ``DELETE … WHERE expires_at <= cutoff AND id IN (SELECT id …
        WHERE expires_at <= cutoff ORDER BY expires_at LIMIT n)``: one round trip, and
        faster than reading the ids first and deleting them in a second statement
        (``python -m benchmarks purge --compare`` measures both). Elsewhere the ids are
        read first, then ``DELETE … WHERE <purgeable> AND id IN (ids)``. Either way a row
        is deleted only if it is still purgeable when the ``DELETE`` reaches it (a key
        renewed or taken over since is left), and no ``pre_delete``/``post_delete``
        signals are sent for the purged rows.
        """
        check_older_than(older_than)
        alias = database(using, self._db)
        connection = connections[alias]
        if not features_of(connection).purges_in_statement:
            yield from self._iter_delete_expired_orm(
                batch_size,
                cutoff if cutoff is not None else _time(alias, None, older_than),
                alias,
                max_batches,
                lease_cutoff,
            )
            return
        sql = statements(connection)
        statement = sql.purge_batch(
            cutoff=cutoff is not None, lease_cutoff=lease_cutoff is not None
        )
        values = {
            "cutoff": None if cutoff is None else sql.prep("expires_at", cutoff, connection),
            "older": -older_than.total_seconds() if older_than else 0.0,
            "lease_cutoff": (
                None if lease_cutoff is None else sql.prep("locked_at", lease_cutoff, connection)
            ),
            "lease": -float(conf.LOCK_TIMEOUT),
            "limit": int(batch_size),
        }
        batches = 0
        while max_batches is None or batches < max_batches:
            deleted = _delete_batch(alias, statement, values)
            if deleted <= 0:
                return
            batches += 1
            yield deleted
            if deleted < batch_size:
                return

    def _iter_delete_expired_orm(
        self,
        batch_size: int,
        cutoff: Any,
        alias: str,
        max_batches: int | None,
        lease_cutoff: datetime | None = None,
    ) -> Iterator[int]:
        """The same through the ORM, for other databases."""
        lease = _time(alias, lease_cutoff, None if lease_cutoff else conf.LOCK_TIMEOUT)
        keys = self._table(alias)
        batches = 0
        while max_batches is None or batches < max_batches:
            with transaction.atomic(using=alias):
                pks = list(
                    keys.purgeable(cutoff, lease)
                    .order_by("expires_at")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not pks:
                    return
                deleted = _delete_where(keys.purgeable(cutoff, lease).filter(pk__in=pks), alias)
            batches += 1
            yield deleted
            if len(pks) < batch_size:
                return

    # Also on the manager, where the tests compare it with the one-statement purge.
    _iter_delete_expired_orm.queryset_only = False  # type: ignore[attr-defined]

    def delete_expired_pks(
        self,
        pks: list[int],
        *,
        now: datetime | None = None,
        using: str | None = None,
        batch_size: int = 1000,
    ) -> int:
        """Delete those of ``pks`` that have expired (the admin's purge action).

        A key that is not expired (any more: a retry may have renewed it) is left
        alone, and so is one in progress under a live lease. Expiry is judged at
        ``now``, by default on the database's clock, and leases always are. Runs one
        short transaction per ``batch_size`` keys; returns how many rows were deleted.
        """
        alias = database(using, self._db)
        cutoff = _time(alias, now)
        lease_cutoff = _time(alias, None, conf.LOCK_TIMEOUT)
        purgeable = self._table(alias).purgeable(cutoff, lease_cutoff)
        total = 0
        for start in range(0, len(pks), batch_size):
            chunk = pks[start : start + batch_size]
            with transaction.atomic(using=alias):
                deleted = _delete_where(purgeable.filter(pk__in=chunk), alias)
            total += deleted
        return total
