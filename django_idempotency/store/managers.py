"""``IdempotencyKey.objects``: the atomic statements of a key's life.

claim, renew, complete, release, store_completed, fence_stale_claim and read, each one
short statement (the SQL is in :mod:`django_idempotency.store.sql`; the purge's half of the
manager in :mod:`django_idempotency.store.purge`). The protocol is told in docs/how-it-works.md,
and the methods in docs/api.md ("The model and its manager").
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import IntegrityError, NotSupportedError, OperationalError, connections, models

from ..conf import conf
from .errors import is_transient, no_partition
from .partitions import log_no_partition
from .purge import PurgeQuerySet
from .records import ClaimResult, ClaimState, KeyRow, kept_ttl
from .sql.partitioned import lock_name
from .sql.statement import Statement
from .sql.statements import Statements, database, statements
from .status import IN_PROGRESS

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ..values.response import StoredResponse

logger = logging.getLogger("django_idempotency")

#: The manager's model: IdempotencyKey, which the models module names (the store relies on
#: ``self.model`` and does not import it).
_Key = TypeVar("_Key", bound=models.Model)


def _folding(statement: Statement | None) -> Statement:
    """A statement that also commits (``commit=True``), which only some databases have
    (:func:`~django_idempotency.store.sql.commits_in_statement` says where)."""
    if statement is None:
        raise NotSupportedError("this database cannot store and COMMIT in one statement")
    return statement


class KeyStatements:
    """The statements of one key, on ``IdempotencyKey.objects`` and on its querysets.

    Each runs on the database of ``using=`` when given, else of the manager or queryset
    (``IdempotencyKey.objects.using("replica").claim(...)``, ``db_manager()``), else on
    ``"default"``.
    """

    _db: str | None

    # -- claim -----------------------------------------------------------------------------

    def claim(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        *,
        ttl: float,
        lock_timeout: float,
        method: str = "",
        path: str = "",
        using: str | None = None,
    ) -> ClaimResult:
        """Claim ``(scope, key)`` with one ``INSERT … ON CONFLICT DO NOTHING RETURNING``.

        The loser reads the row in a second statement (a CTE would not see a
        concurrent winner under READ COMMITTED) and learns whether the key is in
        progress, completed (with its stored response) or used for another request.
        A lease older than ``lock_timeout`` and an expired *completed* record are
        taken over by a conditional UPDATE on the old claim token that re-checks
        staleness. An in-progress record is governed by its lease alone: its TTL
        may pass while a heartbeat keeps the lease alive. Staleness and expiry are
        judged on the database's clock (:func:`clock_in_sql`), in the SQL itself.

        In autocommit (the request path) the claim is a transaction of its own, which
        PostgreSQL commits without waiting for its WAL flush (``synchronous_commit = off``
        in the statement itself): the view's transaction, durable, flushes it with its own
        commit. Inside a transaction the claim commits with it, as that transaction says.

        On MariaDB and MySQL the INSERT is ``ON DUPLICATE KEY UPDATE id = id``; MySQL's
        returns no row, and the claimant finds its own token in the read instead. A
        deadlock or lock wait timeout of the claim's own transaction is retried (up to five
        rounds in all), then raised.
        """
        alias = database(using, self._db)
        connection = connections[alias]
        sql = statements(connection)
        claim = sql.claim if connection.get_autocommit() else sql.claim_in_transaction
        values = {
            "scope": scope,
            "key": key,
            "fingerprint": fingerprint,
            "status": IN_PROGRESS,
            "request_method": method,
            "request_path": path,
            "response_headers": sql.no_headers,
            "ttl": float(ttl),
            "stale": -float(lock_timeout),
        }
        if sql.partitioned:
            # The key's advisory lock, and an expiry a lease ahead at least (a key in
            # progress under a live lease is never in a partition the purge drops).
            values["lock"] = lock_name(scope, key)
            values["ttl"] = float(max(ttl, lock_timeout))
        for attempt in range(5):
            try:
                result = self._claim_once(connection, sql, claim, values)
            except IntegrityError as exc:
                if no_partition(exc):
                    log_no_partition(values["ttl"])
                raise
            except OperationalError as exc:
                # A deadlock or a lock timeout of the claim's own transaction (InnoDB under
                # concurrent inserts) rolled back nothing of the caller's: again. Inside the
                # caller's transaction, or the fifth time, it is the caller's to answer.
                if attempt == 4 or not (connection.get_autocommit() and is_transient(exc)):
                    raise
                continue
            if result is not None:
                return result
        # The row kept changing under us (released, purged or taken over each time):
        # the key is busy, and the client is told to retry.
        return ClaimResult(ClaimState.IN_PROGRESS)

    def _claim_once(
        self,
        connection: BaseDatabaseWrapper,
        sql: Statements,
        claim: Statement,
        values: dict[str, Any],
    ) -> ClaimResult | None:
        """One round of :meth:`claim`: the INSERT, else the read and the answer or the
        takeover. None when the row changed between the statements (claim again)."""
        token = uuid.uuid4()
        values["claim_token"] = sql.prep("claim_token", token, connection)
        row, _count = claim.execute(connection, values)
        if row is not None and row[0] is not None:
            return ClaimResult(ClaimState.CLAIMED, pk=int(row[0]), token=token)

        # Nothing inserted: the key has a row, or a live outbox row (which comes first).
        found, _count = sql.claim_read.execute(connection, values)
        if found is None:
            return None  # released, purged or drained between the two statements: again
        existing = sql.key_row(connection, found)
        if existing.claim_token == token:
            # Inserted by a claim that returns no row (MySQL has no RETURNING): read back.
            return ClaimResult(ClaimState.CLAIMED, pk=existing.pk, token=token)
        if found[-1]:  # a stale lease or an expired completed key (never in the outbox)
            assert existing.claim_token is not None
            pk = self._take_over(
                existing.pk,
                existing.claim_token,
                token,
                values["fingerprint"],
                ttl=values["ttl"],
                lock_timeout=-values["stale"],
                method=values["request_method"],
                path=values["request_path"],
                lock=values.get("lock", ""),
                using=connection.alias,
            )
            if pk is not None:
                return ClaimResult(ClaimState.CLAIMED, pk=pk, token=token, taken_over=True)
            return None  # someone else moved first: read again
        return self._settled(existing, fingerprint=values["fingerprint"])

    @staticmethod
    def _settled(existing: KeyRow, fingerprint: str) -> ClaimResult:
        """What a live row that cannot be taken over answers (an outbox row's ``pk`` is not
        an IdempotencyKey's, and is not returned)."""
        pk = None if existing.from_outbox else existing.pk
        if existing.fingerprint != fingerprint:
            return ClaimResult(ClaimState.MISMATCH, pk=pk)
        if existing.status == IN_PROGRESS:
            return ClaimResult(ClaimState.IN_PROGRESS, pk=pk)
        return ClaimResult(ClaimState.COMPLETED, pk=pk, response=existing.stored_response())

    def read(
        self, scope: str, key: str, *, live: bool = False, using: str | None = None
    ) -> KeyRow | None:
        """The row of ``(scope, key)``, or None: one SELECT whose text is built once, no ORM query
        to compile per call (the values are converted as the ORM converts them).

        A live row of the hybrid strategy's outbox (a completion not drained yet) comes
        first, as a completed row with ``from_outbox`` set: whatever strategy reads the
        key now, it is settled. With ``live``, an expired key row counts as absent, judged
        on the database's clock.
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        statement = sql.read_live if live else sql.read
        found, _count = statement.execute(connection, {"scope": scope, "key": key})
        return None if found is None else sql.key_row(connection, found)

    def _take_over(
        self,
        pk: int,
        old_token: uuid.UUID,
        token: uuid.UUID,
        fingerprint: str,
        *,
        ttl: float,
        lock_timeout: float,
        method: str,
        path: str,
        lock: str = "",
        using: str | None = None,
    ) -> int | None:
        """Replace a stale or expired claim, only if its token is still ``old_token``,
        it is *still* stale or expired (on the database's clock), and the outbox holds no
        live completion of the key; the id of the claim (None when it was not replaced).
        On a partitioned table (``lock``: the key's :func:`lock_name`) the row is deleted
        and the claim inserted anew, under a new id.

        The token alone is not enough: it does not change when the owner renews or
        completes, so an owner that was slow rather than dead could otherwise lose a
        renewed lease, or a stored response, to a claimant that read the row just before.
        Committed like the claim (asynchronously in autocommit, on PostgreSQL).
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        take_over = sql.take_over if connection.get_autocommit() else sql.take_over_in_transaction
        row, taken = take_over.execute(
            connection,
            {
                "lock": lock,
                "pk": pk,
                "old_token": sql.prep("claim_token", old_token, connection),
                "token": sql.prep("claim_token", token, connection),
                "fingerprint": fingerprint,
                "method": method,
                "path": path,
                "response_headers": sql.no_headers,
                "ttl": float(ttl),
                "stale": -float(lock_timeout),
            },
        )
        if taken != 1:
            return None
        return int(row[0]) if sql.partitioned else pk

    def fence_stale_claim(
        self, scope: str, key: str, lock_timeout: float, *, using: str | None = None
    ) -> bool:
        """Whether a commit of ``(scope, key)`` made elsewhere (the ``hybrid`` strategy's
        outbox row) may go ahead: True when IdempotencyKey has no live row for it.

        A completed row whose TTL is over does not count. An in-progress claim does as
        long as its lease is live (on the database's clock), whatever its TTL; a stale
        one is deleted (a conditional DELETE on its token that re-checks staleness), which
        fences its owner out: its ``complete`` will find no row. Run it in the
        transaction of the commit it guards. One statement when the key has no row.
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        values: dict[str, Any] = {"scope": scope, "key": key, "stale": -float(lock_timeout)}
        found, _count = sql.fence_read.execute(connection, values)
        if found is None:
            return True
        pk, status, token, free = found
        if not free:
            return False
        if status != IN_PROGRESS:
            return True  # completed and expired: the commit replaces it
        values["pk"] = pk
        values["token"] = token  # as the database gave it
        _row, deleted = sql.fence_delete.execute(connection, values)
        return bool(deleted == 1)

    # -- the owner's statements ------------------------------------------------------------

    def _owner(
        self, using: str | None, pk: int, token: uuid.UUID
    ) -> tuple[Any, Statements, dict[str, Any]]:
        """The connection, statements and values of a statement on the claim
        ``(pk, token)``."""
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        return connection, sql, {"pk": pk, "token": sql.prep("claim_token", token, connection)}

    def renew(
        self,
        pk: int,
        token: uuid.UUID,
        *,
        lock_timeout: float | None = None,
        using: str | None = None,
    ) -> bool:
        """Extend the lease (to the database's now); False when the claim was taken over
        or is gone. On a partitioned table the key's expiry is kept at least
        ``lock_timeout`` (default ``LOCK_TIMEOUT``) ahead too."""
        connection, sql, values = self._owner(using, pk, token)
        values["lease"] = float(conf.LOCK_TIMEOUT if lock_timeout is None else lock_timeout)
        _row, count = sql.renew.execute(connection, values)
        return bool(count == 1)

    def complete(
        self,
        pk: int,
        token: uuid.UUID,
        response: StoredResponse,
        *,
        ttl: float,
        commit: bool = False,
        using: str | None = None,
    ) -> bool:
        """Store the response; False when ``token`` is no longer the claim's (fencing).

        ``commit``: the statement also commits the current transaction, in the same
        round trip (PostgreSQL through psycopg 3 with client-side binding, see
        ``store.sql.commits_in_statement``; the caller checks that, and then ends its
        ``atomic`` block at once). When it returns False nothing committed and the
        transaction is aborted: roll it back."""
        connection, sql, values = self._owner(using, pk, token)
        values["response_status"] = response.status
        values["response_headers"] = sql.prep("response_headers", response.headers, connection)
        values["response_body"] = sql.prep("response_body", response.body, connection)
        values["ttl"] = float(ttl)
        values["kept_ttl"] = kept_ttl(float(ttl))
        if commit:
            return _folding(sql.complete_and_commit).store_and_commit(connection, values)
        _row, count = sql.complete.execute(connection, values)
        return bool(count == 1)

    def store_completed(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        response: StoredResponse,
        *,
        ttl: float,
        method: str = "",
        path: str = "",
        commit: bool = False,
        using: str | None = None,
    ) -> bool:
        """Write the completed record of ``(scope, key)`` in one
        ``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING``;
        False when a live record of the key exists (it is left as it is). ``commit``: as
        for :meth:`complete`.

        For a caller that already serialises ``(scope, key)`` by other means (the
        ``advisory_lock`` strategy holds a transaction-level advisory lock on it):
        there is no claim token to check, and the row gets a fresh one.
        """
        connection = connections[database(using, self._db)]
        sql = statements(connection)
        values = {
            "scope": scope,
            "key": key,
            "fingerprint": fingerprint,
            "claim_token": sql.prep("claim_token", uuid.uuid4(), connection),
            "request_method": method,
            "request_path": path,
            "response_status": response.status,
            "response_headers": sql.prep("response_headers", response.headers, connection),
            "response_body": sql.prep("response_body", response.body, connection),
            "ttl": float(ttl),
        }
        if commit:
            return _folding(sql.store_and_commit).store_and_commit(connection, values)
        if sql.store is None:
            raise NotSupportedError(
                f"store_completed() needs INSERT … ON CONFLICT … DO UPDATE … WHERE, which "
                f"{connection.vendor} does not have (it is advisory_lock's: PostgreSQL)"
            )
        row, _count = sql.store.execute(connection, values)
        return row is not None

    def release(self, pk: int, token: uuid.UUID, *, using: str | None = None) -> bool:
        """Delete an in-progress claim so the client may retry; only for its own token."""
        connection, sql, values = self._owner(using, pk, token)
        _row, count = sql.release.execute(connection, values)
        return bool(count == 1)


class IdempotencyKeyQuerySet(KeyStatements, PurgeQuerySet[_Key]):
    """IdempotencyKey's queryset: ``expired()`` and ``purgeable()`` filter it, the key's
    statements and the purge run on its database."""


_Manager = models.Manager.from_queryset(IdempotencyKeyQuerySet)


class IdempotencyKeyManager(KeyStatements, _Manager[_Key]):
    """``IdempotencyKey.objects``: the key's statements, and the queryset's methods."""
