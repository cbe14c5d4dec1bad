"""The Strategy interface and the one session protocol every strategy shares.

A strategy implements :meth:`Strategy.claim`: it claims the key of one attempt and
returns an outcome:

* a :class:`TransactionalClaim` — this request owns the key; the view runs inside
  the session, in the transaction that will also store its response;
* :class:`InFlight` — another request holds the key (409);
* :class:`Replay` — the key completed; here is the stored response;
* :class:`Mismatch` — the key was used for a different request (422);
* :class:`Delegate` — another strategy handles this attempt (a fallback).

:class:`Session` (what ``Strategy.session()`` returns) owns everything else, once
for all strategies: the transaction around the view, the response stored as its last
statement, the store that waits for a rollback the view asked for, giving the key
back after an exception, and never touching the record again once COMMIT has
returned. See docs/how-it-works.md and docs/api.md ("Writing a strategy").
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.utils.translation import gettext_lazy as _

from ..errors import DatabaseMisconfigured, LeaseLost, StoreUnavailable
from ..protocol import writeguard
from ..protocol.replay import StoredResponse
from ..store.errors import is_connection_lost, is_transient
from ..store.sql import commits_in_statement
from . import testcase

if TYPE_CHECKING:
    from ..protocol.waiting import Listener
    from ..protocol.writeguard import WriteGuard

logger = logging.getLogger("django_idempotency")


@dataclass(frozen=True)
class Attempt:
    """Everything a strategy needs to know about one request."""

    scope: str
    key: str
    fingerprint: str
    ttl: float
    lock_timeout: float
    method: str = ""
    path: str = ""
    atomic: bool = True
    database: str = "default"
    #: Seconds a duplicate waits for this key's answer (``WAIT``); 0: the 409 at once.
    #: When > 0 the request that completes or releases the key also wakes its waiters.
    wait: float = 0.0


#: The detail of a 503 for a response that could not be stored.
NOT_STORED_DETAIL = _(
    "The response could not be stored, so this request's changes were rolled back. "
    "Retry with the same Idempotency-Key."
)


def store_failed(exc: DatabaseError, *, committing: bool) -> BaseException:
    """What a store that failed with ``exc`` raises: ``StoreUnavailable`` (a 503; the
    view's writes are rolled back). When its statement also ran the COMMIT
    (:attr:`TransactionalClaim.commit_with_store`), a lost connection or a transient
    conflict is raised as it is, so that the client gets the answer a failed COMMIT gets
    (``database-unavailable``, ``transient-conflict``)."""
    if committing and (is_connection_lost(exc) or is_transient(exc)):
        return exc
    error = StoreUnavailable(NOT_STORED_DETAIL)
    error.__cause__ = exc
    return error


class Outcome:
    """What a claim found."""

    @property
    def label(self) -> str:
        """The outcome's name in metrics and logs: ``claimed``, ``taken_over``,
        ``in_flight``, ``replay``, ``mismatch``; ``error`` for one the engine does not
        handle. Subclasses override it with a class attribute (unannotated: not a field),
        or with a property where it depends on the claim."""
        return "error"


@dataclass(frozen=True)
class InFlight(Outcome):
    retry_after: int = 1
    label = "in_flight"


@dataclass(frozen=True)
class Replay(Outcome):
    response: StoredResponse
    label = "replay"


@dataclass(frozen=True)
class Mismatch(Outcome):
    label = "mismatch"


@dataclass(frozen=True)
class Delegate(Outcome):
    """Hand the attempt to ``strategy`` (e.g. the ``db`` strategy while Redis is down)."""

    strategy: Strategy


class Claimed(Outcome, abc.ABC):
    """This request owns the key until it completes or releases it."""

    #: True when the claim replaced a stale lease or an expired record.
    taken_over: bool = False
    #: Whether ``renew`` extends a lease (a heartbeat keeps it alive while the view runs).
    renewable: bool = True
    #: True once the view's writes and the stored response are durable (after COMMIT).
    committed: bool = False

    @property
    def label(self) -> str:
        return "taken_over" if self.taken_over else "claimed"

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the lease. False means the claim was lost."""

    @abc.abstractmethod
    def complete(self, response: StoredResponse) -> None:
        """Store the response. Raises ``LeaseLost`` when the claim token no longer matches."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the key back so that a retry runs the view again."""


class TransactionalClaim(Claimed):
    """A claim whose view runs in the transaction its :class:`Session` opens, and whose
    response is stored as the last statement of that transaction.

    A subclass implements :meth:`renew`, :meth:`_store` and :meth:`delete`, and may
    override the hooks :meth:`settled`, :meth:`store_pending`, :meth:`discard`,
    :meth:`after_commit` and :meth:`lost`.
    """

    #: Whether :meth:`_store` can also COMMIT the view's transaction, in the round trip of
    #: its own statement, when :attr:`commit_with_store` says so.
    folds_commit: bool = False
    #: Set by the session while the view runs: the refusal of its writes to the other
    #: databases (``django_idempotency.protocol.writeguard``); None with one database.
    guard: WriteGuard | None = None

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        #: Set by the session while the view runs inside its transaction.
        self.in_transaction = False
        #: The response of a view that marked its transaction for rollback.
        self.pending: StoredResponse | None = None
        self.released = False
        self.completed = False
        self.committed = False
        #: Set by the session when the store may commit its transaction (see
        #: :attr:`commit_with_store`): ends Django's ``atomic`` block after that COMMIT.
        self._end_committed: Callable[[], None] | None = None

    @property
    def commit_with_store(self) -> bool:
        """Whether :meth:`_store` is to COMMIT the view's transaction in its statement's
        round trip (``_sql.and_commit``): the session's transaction is the outermost, on
        PostgreSQL through psycopg 3 with client-side binding. A store that does must
        raise when it stored nothing, with nothing committed."""
        return self._end_committed is not None and self.in_transaction

    # -- what the engine calls -------------------------------------------------------------

    def complete(self, response: StoredResponse) -> None:
        """Store ``response`` in the view's transaction. When the view marked that
        transaction for rollback (DRF does after an ``APIException`` with
        ``ATOMIC_REQUESTS``), its writes are undone and the response is kept as
        ``pending``: the session stores it after the rollback, unless another
        execution completed the key in the meantime. ``DatabaseMisconfigured`` when a
        write of the view to another database was refused: nothing is stored."""
        if self.guard is not None:
            self.guard.check()
        if self.in_transaction and transaction.get_rollback(using=self.attempt.database):
            self.pending = response
            return
        folded = self.commit_with_store
        self._store(response)
        self.completed = True
        if folded:
            # The store's statement committed the transaction: durable now.
            self.committed, self.in_transaction = True, False
            end, self._end_committed = self._end_committed, None
            assert end is not None
            end()
        elif not self.in_transaction:
            self.committed = True  # no transaction: the store itself is durable

    def release(self) -> None:
        """Roll the view's writes back (inside the transaction); the session gives the
        key back once the transaction has ended. ``DatabaseMisconfigured`` (after that)
        when a write of the view to another database was refused."""
        self.released = True
        if self.in_transaction:
            transaction.set_rollback(True, using=self.attempt.database)
        if self.guard is not None:
            self.guard.check()

    # -- what a subclass implements --------------------------------------------------------

    @abc.abstractmethod
    def _store(self, response: StoredResponse) -> None:
        """Write the completed record, fenced by this claim; ``LeaseLost`` when the
        claim is no longer ours, ``StoreUnavailable`` when the store failed."""

    @abc.abstractmethod
    def delete(self) -> bool:
        """Give back this claim's *in-progress* record, if it is still ours; whether it
        was. Never deletes a completed record."""

    # -- hooks -----------------------------------------------------------------------------

    def settled(self) -> Outcome | None:
        """Before the view runs: an outcome that makes running it unnecessary (a record
        of the key in another store), or None. On PostgreSQL it runs as the first
        statement of the view's transaction, elsewhere just before it."""
        return None

    def store_pending(self, response: StoredResponse) -> bool:
        """Store the response of a view whose transaction rolled back, in a transaction
        of its own, unless the key was completed by another execution meanwhile
        (whether it was stored). The default suits a claim whose ``_store`` is fenced
        by its token."""
        using = self.attempt.database
        with transaction.atomic(using=using):
            self._store(response)
        return True

    def discard(self) -> None:
        """The transaction did not commit: undo whatever of this claim is outside it
        (a completion written to another store before COMMIT) and give the key back."""
        self.delete()

    def after_commit(self) -> None:
        """Runs once the completion is durable, even when an ``on_commit`` hook of the
        view raised (publishing to a cache, queueing work). Must not raise."""

    def lost(self) -> None:
        """The claim was lost to another execution (``LeaseLost``); nothing to give back."""


class Strategy(abc.ABC):
    """Base class of the claim strategies; subclasses are stateless and thread-safe."""

    name: str = ""
    #: The claim is made inside the view's transaction (``advisory_lock``: the lock is
    #: the transaction's); it then always runs in one, whatever ``ATOMIC`` says.
    claims_in_transaction: bool = False

    @abc.abstractmethod
    def claim(self, attempt: Attempt) -> Outcome:
        """Claim ``attempt``'s key (see the module doc); ``StoreUnavailable`` when the
        store cannot be reached."""

    #: The claim itself waits for the key's holder (``advisory_lock``: the lock wait,
    #: bounded by ``attempt.wait``); the engine then does not wait again after it.
    waits_in_claim: bool = False

    def listener(self, attempt: Attempt) -> Listener | None:
        """What wakes the duplicates waiting for ``attempt``'s key in this process
        (see ``django_idempotency.protocol.waiting``); None: they poll. Must not raise."""
        return None

    def session(self, attempt: Attempt) -> Session:
        """A context manager that claims the key and yields the outcome."""
        return Session(self, attempt)

    def describe(self) -> str:
        return self.name


class Session:
    """One attempt, from claim to the end of the view's transaction.

    ``__enter__`` claims and returns the outcome; for a claim it has opened the view's
    transaction. ``__exit__`` ends it:

    * the transaction committed: the record stays as stored, whatever is raised after
      COMMIT (an ``on_commit`` hook of the view); ``after_commit()`` runs, and the
      hook's error propagates with the key completed;
    * the view's transaction rolled back at its own request (``release()``, or a DRF
      rollback with a pending response): the key is given back, or the pending
      response is stored if no other execution completed the key meanwhile;
    * anything raised before COMMIT returned (the view, the store, the COMMIT itself):
      the claim is discarded so that a retry runs the view again, except when the
      claim was lost to another execution (``LeaseLost``), which owns the key now.
    """

    def __init__(self, strategy: Strategy, attempt: Attempt) -> None:
        self.strategy = strategy
        self.attempt = attempt
        self.claim: TransactionalClaim | None = None
        self._atomic: Any = None
        #: The connection of ``attempt.database`` (this thread's), when the session uses it.
        self._connection: Any = None
        #: Whether ``_atomic`` is the connection's outermost block and commits at its end.
        self._outermost = False
        #: An on_commit hook's error, raised at the exit (see :meth:`_end_committed`).
        self._hook_error: BaseException | None = None
        self._inner: Any = None
        #: While the view runs: the refusal of its writes to the other databases.
        self._guard: WriteGuard | None = None

    # -- enter -----------------------------------------------------------------------------

    def __enter__(self) -> Outcome:
        strategy, attempt = self.strategy, self.attempt
        if attempt.atomic or strategy.claims_in_transaction:
            connection = self._connection = connections[attempt.database]
            # Manual mode needs set_autocommit(False), which connects: an unconnected
            # connection is not in it (and its ``autocommit`` is not read yet).
            if (
                connection.connection is not None
                and not connection.autocommit
                and not connection.in_atomic_block
            ):
                # No on_commit there: the session could never tell when the response is
                # durable. Refused before anything is claimed.
                raise transaction.TransactionManagementError(
                    "django-idempotency cannot run a view in manual transaction management "
                    f"(set_autocommit(False) on {attempt.database!r}): run it in autocommit "
                    "or inside transaction.atomic()."
                )
        if strategy.claims_in_transaction:
            self._begin()
            try:
                outcome = strategy.claim(attempt)
            except BaseException as exc:
                self._abandon(exc)
                raise
            if not isinstance(outcome, TransactionalClaim):
                self._abandon(None)
        else:
            outcome = strategy.claim(attempt)
        if isinstance(outcome, Delegate):
            return self._delegate(outcome)
        if not isinstance(outcome, TransactionalClaim):
            return outcome
        self.claim = outcome
        try:
            settled = self._settle_and_begin(outcome)
        except BaseException as exc:
            self.claim = None
            if self._atomic is not None:
                self._abandon(exc)
            outcome.discard()
            raise
        if settled is None:
            outcome.in_transaction = self._atomic is not None
            # Last: nothing can fail between it and the ``with`` block that closes it.
            self._guard = outcome.guard = writeguard.guard(attempt)
            return outcome
        # The key was known elsewhere: this request does not run the view.
        self.claim = None
        outcome.delete()
        if isinstance(settled, Delegate):
            return self._delegate(settled)
        return settled

    def _settle_and_begin(self, claim: TransactionalClaim) -> Outcome | None:
        atomic = self.attempt.atomic or self.strategy.claims_in_transaction
        in_transaction = (
            atomic and self._connection.vendor == "postgresql"
        ) or self._atomic is not None
        settled = None
        if not in_transaction:
            # On SQLite a read would fix the transaction's snapshot, and the view's first
            # write would then fail ("database is locked") after any other commit.
            settled = claim.settled()
        if settled is None and atomic:
            if self._atomic is None:
                self._begin()
            if in_transaction:
                settled = claim.settled()
        if settled is not None and self._atomic is not None:
            self._abandon(None)
        elif (
            self._atomic is not None
            and self._outermost
            and claim.folds_commit
            and commits_in_statement(self._connection)
        ):
            claim._end_committed = self._end_committed
        return settled

    def _delegate(self, delegate: Delegate) -> Outcome:
        self._inner = delegate.strategy.session(self.attempt)
        outcome: Outcome = self._inner.__enter__()
        return outcome

    def _begin(self) -> None:
        connection = self._connection
        try:
            # Not in an outer block, nor in a transaction the caller manages by hand
            # (set_autocommit(False)): then this block's end is the COMMIT.
            outermost = not connection.in_atomic_block and connection.get_autocommit()
            atomic = transaction.atomic(using=self.attempt.database)
            atomic.__enter__()
        except DatabaseError as exc:
            raise StoreUnavailable() from exc
        self._atomic, self._outermost = atomic, outermost

    def _end_committed(self) -> None:
        """The claim's store has committed the transaction in its own round trip: end
        Django's block now, so that nothing runs in it after COMMIT. Its COMMIT finds
        nothing to commit, autocommit comes back, then the view's ``on_commit`` hooks
        run; a hook's error is raised at the session's exit, as when COMMIT is there."""
        atomic, self._atomic = self._atomic, None
        try:
            atomic.__exit__(None, None, None)
        except BaseException as exc:
            self._hook_error = exc

    def _abandon(self, exc: BaseException | None) -> None:
        """End the transaction without keeping anything of it."""
        atomic, self._atomic = self._atomic, None
        if exc is None:
            transaction.set_rollback(True, using=self.attempt.database)
            atomic.__exit__(None, None, None)
        else:
            atomic.__exit__(type(exc), exc, exc.__traceback__)

    # -- exit ------------------------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._inner is not None:
            inner, self._inner = self._inner, None
            return bool(inner.__exit__(exc_type, exc, tb))
        claim, self.claim = self.claim, None
        if claim is None:
            return None
        given = exc
        refused = self._close_guard(claim, exc)
        if refused is not None:
            exc_type, exc, tb = type(refused), refused, refused.__traceback__
        error = exc
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            try:
                self._end(atomic, claim, exc_type, exc, tb)
            except BaseException as raised:
                error = raised
            finally:
                claim.in_transaction = False
        elif self._hook_error is not None and error is None:
            error, self._hook_error = self._hook_error, None
        if claim.committed:
            # Durable: nothing may delete or rewrite the record now.
            claim.after_commit()
        elif isinstance(error, LeaseLost):
            claim.lost()
        elif error is not None:
            claim.discard()
        elif claim.released:
            claim.delete()
        elif claim.pending is not None:
            self._store_pending(claim, claim.pending)
        elif claim.completed:
            # The session's block was nested in the project's transaction: the response is
            # durable when that commits (in a TestCase: when its savepoint is released).
            self._after_outer_commit(claim)
        else:
            claim.delete()  # neither completed nor released: nothing is kept
        if error is not None and error is not given:
            raise error
        return None

    def _close_guard(
        self, claim: TransactionalClaim, exc: BaseException | None
    ) -> DatabaseMisconfigured | None:
        """Take the write guard off the other databases' connections (the hooks that run
        after COMMIT are not the view). When it refused a write and the view went on (it
        caught the refusal, or raised something else), the refusal is what ends the
        session: the transaction rolls back and the key is given back."""
        guard, self._guard = self._guard, None
        claim.guard = None
        if guard is None:
            return None
        guard.close()
        if guard.refused is None or isinstance(exc, DatabaseMisconfigured) or claim.committed:
            return None
        refused = DatabaseMisconfigured()
        refused.__cause__ = exc if exc is not None else guard.refused
        return refused

    def _end(
        self,
        atomic: Any,
        claim: TransactionalClaim,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End the session's block, telling whether it made the completion durable
        (``claim.committed``) without an ``on_commit`` callback of the library's, which
        the view's tests would see among theirs.

        * Outermost: the view's hooks are held back while Django's block COMMITs (or
          rolls back); once COMMIT has returned the claim is committed, then the hooks
          run as Django runs them (an error of theirs propagates; a rollback drops them).
        * Nested only in a ``TestCase``'s blocks: that test never commits; the end of
          this block is where production COMMITs, so a block released without a
          rollback counts as committed (the test's rollback undoes the database rows).
        * Nested in a transaction of the project's (``ATOMIC_REQUESTS``, an atomic block
          of its own): durable only at that COMMIT; ``__exit__`` registers the one
          callback that runs ``after_commit()`` then.
        """
        connection = self._connection
        commits = (
            exc_type is None
            and not connection.needs_rollback
            and not connection.closed_in_transaction
        )
        if not self._outermost:
            outer = connection.atomic_blocks[:-1]
            in_test_only = bool(outer) and all(getattr(b, "_from_testcase", False) for b in outer)
            atomic.__exit__(exc_type, exc, tb)  # RELEASE (or ROLLBACK TO) SAVEPOINT
            if commits and in_test_only and not connection.needs_rollback:
                claim.committed = claim.completed and not claim.released
            return
        hooks, connection.run_on_commit = connection.run_on_commit, []
        try:
            atomic.__exit__(exc_type, exc, tb)  # COMMIT or ROLLBACK
        except BaseException:
            hooks.clear()  # the COMMIT failed and was rolled back: Django drops the hooks
            raise
        if not commits:
            return
        claim.committed = True  # COMMIT returned: nothing may touch the record now
        connection.run_on_commit = hooks + connection.run_on_commit
        connection.run_and_clear_commit_hooks()  # the view's, in Django's order and way

    def _after_outer_commit(self, claim: TransactionalClaim) -> None:
        """Run ``after_commit()`` when the transaction around the session's commits: the
        library's one ``on_commit`` callback, or, inside a ``TestCase``, none (see
        ``strategies.testcase``)."""
        connection = self._connection
        sid = None if connection is None else testcase.commit_point(connection)
        if sid is None:
            transaction.on_commit(claim.after_commit, using=self.attempt.database)
        else:
            testcase.defer_to_release(connection, sid, claim.after_commit)

    def _store_pending(self, claim: TransactionalClaim, response: StoredResponse) -> None:
        try:
            stored = claim.store_pending(response)
        except LeaseLost:
            claim.lost()
            stored = False
        except BaseException:
            claim.discard()
            raise
        if stored:
            claim.committed = claim.completed = True
            claim.after_commit()
        else:
            logger.info(
                "idempotency key %s (scope %s): another execution completed it while this "
                "request's writes were rolled back; its record is kept",
                self.attempt.key,
                self.attempt.scope,
            )
