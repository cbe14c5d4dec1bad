"""The lifecycle of one claimed key, from the claim to the end of the view's transaction.

One state machine for every strategy. A strategy claims a key and hands back a
:class:`~django_idempotency.strategies.base.Claim`: its store, its release and its
hooks. :class:`Lifecycle` owns everything else, once: the transaction around the view,
the response stored as that transaction's last statement, the store that waits for a
rollback the view asked for, giving the key back after an exception, and never touching
the record again once COMMIT has returned::

    CLAIMED --begin--> RUNNING --complete()--> COMPLETED --COMMIT--> COMMITTED
       |                  |  \\--complete(), the store's statement COMMITs, or no
       |                  |     transaction----------------------------> COMMITTED
       |                  |--complete() in a transaction marked for rollback--> PENDING
       |                  |--release()--> RELEASED --rollback--> GIVEN_BACK
       |                  '--an exception before COMMIT--> GIVEN_BACK, or LOST (LeaseLost)
       '--the key is settled elsewhere (another store's record)--> SETTLED
    PENDING --stored after the rollback--> COMMITTED, or LOST / SUPERSEDED / GIVEN_BACK
    COMPLETED --nested in the project's transaction--> AWAITING_OUTER_COMMIT
    COMPLETED --COMMIT sent, its answer never came--> UNKNOWN

:data:`TRANSITIONS` is that picture as data; every move is checked against it. See
docs/how-it-works.md.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.utils.translation import gettext_lazy as _

from ..errors import DatabaseMisconfigured, LeaseLost, StoreUnavailable
from ..store.errors import is_connection_lost
from ..store.sql.deadline import bounded
from ..store.sql.postgresql import commits_in_statement
from ..store.sql.statements import features_of
from ..strategies.base import Attempt, Claim, Delegate, Outcome, Strategy
from . import testcase, transactions, writeguard

if TYPE_CHECKING:
    from .replay import StoredResponse
    from .writeguard import WriteGuard

logger = logging.getLogger("django_idempotency")

#: The detail of the 503 for a view with steps inside a transaction of the project's.
STEPS_NEED_COMMITS = _(
    "This view runs in steps, each committed on its own, but it was called inside a "
    "transaction (ATOMIC_REQUESTS or an atomic block) that would hold them all back."
)


#: The detail of the 503 for a step whose transaction was marked for rollback.
STEP_ROLLED_BACK = _(
    "A step of this request was rolled back instead of committed. Retry with the same "
    "Idempotency-Key: the steps that committed are not run again."
)


class State(enum.Enum):
    """Where a claimed key is in its lifecycle."""

    # Members are singletons compared by identity: hashed by identity too, in C, rather
    # than by Enum's Python-level hash of the name (each move looks two of them up).
    __hash__ = object.__hash__

    #: The strategy claimed the key; the view's transaction is not open yet.
    CLAIMED = "claimed"
    #: The view runs (in the lifecycle's transaction, when there is one).
    RUNNING = "running"
    #: The response is stored in the view's transaction, which has not committed yet.
    COMPLETED = "completed"
    #: The view's transaction was marked for rollback: its response is stored after it.
    PENDING = "pending"
    #: The view asked for its writes to be rolled back and the key given back.
    RELEASED = "released"
    #: Durable: the view's writes and the response. Nothing touches the record now.
    COMMITTED = "committed"
    #: Completed inside a transaction of the project's: durable when that commits.
    AWAITING_OUTER_COMMIT = "awaiting_outer_commit"
    #: The key was given back: a retry runs the view again.
    GIVEN_BACK = "given_back"
    #: The claim was taken over by another execution, which owns the key now.
    LOST = "lost"
    #: Another execution completed the key while this one's writes rolled back.
    SUPERSEDED = "superseded"
    #: The key was known elsewhere before the view ran (``settled()``): it never ran.
    SETTLED = "settled"
    #: COMMIT was sent and its answer never came (the connection was lost, or cut by
    #: ``DATABASE_TIMEOUT``): the writes and the response may be durable or not.
    UNKNOWN = "unknown"


S = State
#: The allowed moves; :meth:`Lifecycle._move` refuses any other.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.CLAIMED: frozenset({S.RUNNING, S.SETTLED, S.GIVEN_BACK}),
    S.RUNNING: frozenset({S.COMPLETED, S.COMMITTED, S.PENDING, S.RELEASED, S.GIVEN_BACK, S.LOST}),
    S.COMPLETED: frozenset({S.COMMITTED, S.AWAITING_OUTER_COMMIT, S.GIVEN_BACK, S.LOST, S.UNKNOWN}),
    S.PENDING: frozenset({S.COMMITTED, S.LOST, S.SUPERSEDED, S.GIVEN_BACK}),
    S.RELEASED: frozenset({S.GIVEN_BACK, S.LOST}),
    S.COMMITTED: frozenset(),
    S.AWAITING_OUTER_COMMIT: frozenset(),
    S.GIVEN_BACK: frozenset(),
    S.LOST: frozenset(),
    S.SUPERSEDED: frozenset(),
    S.SETTLED: frozenset(),
    S.UNKNOWN: frozenset(),
}


class Lifecycle:
    """One attempt::

        with Lifecycle(strategy, attempt) as lifecycle:
            if lifecycle.claimed:
                lifecycle.complete(capture(view()))  # or lifecycle.release()
            else:
                ...  # lifecycle.outcome: InProgress, Replay or Mismatch

    ``__enter__`` claims; for a claim it has opened the view's transaction, and the view
    runs in the ``with`` block. ``__exit__`` ends the transaction and moves the claim to
    its final state.
    """

    def __init__(self, strategy: Strategy, attempt: Attempt) -> None:
        self.strategy = strategy
        self.attempt = attempt
        self.state: State | None = None
        #: What the claim found (set by ``__enter__``).
        self.outcome: Outcome | None = None
        self.claim: Claim | None = None
        #: The lifecycle of the strategy a claim was delegated to (a fallback).
        self._inner: Lifecycle | None = None
        #: The connection of ``attempt.database`` (this thread's), when it is used.
        self._connection: Any = None
        #: Django's block around the view, while it is open.
        self._atomic: Any = None
        #: Whether ``_atomic`` is the connection's outermost block (its end is the COMMIT).
        self._outermost = False
        #: Whether the claim's store also COMMITs, in its statement's round trip.
        self._fold = False
        #: The response of a view whose transaction was marked for rollback.
        self._pending: StoredResponse | None = None
        #: An ``on_commit`` hook's error after a folded COMMIT, raised at the exit.
        self._hook_error: BaseException | None = None
        #: Whether the COMMIT failed without an answer: its outcome is unknown.
        self._commit_unknown = False
        self._guard: WriteGuard | None = None

    # -- the state machine ---------------------------------------------------------------

    def _move(self, to: State) -> None:
        if self.state is not None and to not in TRANSITIONS[self.state]:
            raise AssertionError(f"idempotency lifecycle: {self.state.name} -> {to.name}")
        self.state = to

    @property
    def committed(self) -> bool:
        """Whether the view's writes and the response are durable."""
        if self._inner is not None:
            return self._inner.committed
        return self.state is State.COMMITTED

    @property
    def claimed(self) -> bool:
        """Whether this request owns the key (the view is to run)."""
        return isinstance(self.outcome, Claim)

    # -- enter ---------------------------------------------------------------------------

    def __enter__(self) -> Lifecycle:
        self.outcome = self._enter()
        return self

    def _enter(self) -> Outcome:
        strategy, attempt = self.strategy, self.attempt
        if attempt.atomic or strategy.claims_in_transaction:
            self._connection = connections[attempt.database]
            refuse_manual_transactions(self._connection, attempt.database)
        outcome = self._claim()
        if isinstance(outcome, Delegate):
            return self._delegate(outcome)
        if not isinstance(outcome, Claim):
            return outcome
        self.claim = outcome
        self._move(State.CLAIMED)
        try:
            settled = self._settle_and_begin(outcome)
        except BaseException as exc:
            if self._atomic is not None:
                self._abandon(exc)
            self._move(State.GIVEN_BACK)
            outcome.discard()
            raise
        if settled is None:
            self._move(State.RUNNING)
            # Last: nothing can fail between it and the ``with`` block that closes it.
            self._guard = writeguard.guard(attempt)
            return outcome
        # The key was known elsewhere: this request does not run the view.
        self._move(State.SETTLED)
        outcome.release()
        if isinstance(settled, Delegate):
            return self._delegate(settled)
        return settled

    def _claim(self) -> Outcome:
        """The strategy's claim; inside the view's transaction for a strategy that claims
        there (``advisory_lock``), which is ended again unless the key was claimed."""
        if not self.strategy.claims_in_transaction:
            return self.strategy.claim(self.attempt)
        self._begin()
        try:
            outcome = self.strategy.claim(self.attempt)
        except BaseException as exc:
            self._abandon(exc)
            raise
        if not isinstance(outcome, Claim):
            self._abandon(None)
        return outcome

    def _settle_and_begin(self, claim: Claim) -> Outcome | None:
        """Ask the claim whether the key is settled elsewhere, and open the view's
        transaction (where the database allows, the question is its first statement)."""
        atomic = self.attempt.atomic or self.strategy.claims_in_transaction
        in_transaction = (
            atomic and features_of(self._connection).settles_in_view_transaction
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
        self._fold = (
            self._atomic is not None
            and self._outermost
            and claim.folds_commit
            and commits_in_statement(self._connection)
        )
        return settled

    def _delegate(self, delegate: Delegate) -> Outcome:
        inner = self._inner = Lifecycle(delegate.strategy, self.attempt)
        inner.__enter__()
        assert inner.outcome is not None
        return inner.outcome

    def _begin(self) -> None:
        connection = self._connection
        try:
            # Not in an outer block, nor in a transaction the caller manages by hand
            # (set_autocommit(False)): then this block's end is the COMMIT.
            outermost = transactions.starts_transaction(connection)
            atomic = transaction.atomic(using=self.attempt.database)
            atomic.__enter__()
        except DatabaseError as exc:
            raise StoreUnavailable() from exc
        self._atomic, self._outermost = atomic, outermost

    def _abandon(self, exc: BaseException | None) -> None:
        """End the transaction without keeping anything of it."""
        atomic, self._atomic = self._atomic, None
        if exc is None:
            transaction.set_rollback(True, using=self.attempt.database)
            atomic.__exit__(None, None, None)
        else:
            atomic.__exit__(type(exc), exc, exc.__traceback__)

    # -- what the engine calls while the view's transaction is open ------------------------

    def complete(self, response: StoredResponse) -> None:
        """Store ``response`` as the view's transaction's last statement. When the view
        marked that transaction for rollback (DRF does after an ``APIException`` with
        ``ATOMIC_REQUESTS``), its writes are undone and the response is kept: it is stored
        after the rollback unless another execution completed the key meanwhile.
        ``DatabaseMisconfigured`` when a write of the view to another database was
        refused: nothing is stored."""
        if self._inner is not None:
            return self._inner.complete(response)
        claim = self.claim
        assert claim is not None and self.state is State.RUNNING, self.state
        if self._guard is not None:
            self._guard.check()
        # The block's own connection (transaction.get_rollback() would look it up again).
        if self._atomic is not None and self._connection.get_rollback():
            self._pending = response
            self._move(State.PENDING)
            return None
        claim.store(response, commit=self._fold)
        if self._fold:
            # The store's statement committed the transaction: durable now.
            self._move(State.COMMITTED)
            self._end_after_folded_commit()
        elif self._atomic is None:
            self._move(State.COMMITTED)  # no transaction: the store itself is durable
        else:
            self._move(State.COMPLETED)
        return None

    @contextlib.contextmanager
    def phase(self) -> Iterator[None]:
        """One step of a view that runs in steps (docs/steps.md): the ``with`` block's
        writes, and the record of the step the block ends with, COMMIT at its end, in a
        transaction of their own. In the view's transaction (the usual case) the block is
        a savepoint in it: an error rolls the step back alone; at its end the view's
        transaction COMMITs and a new one begins for what follows. Refused
        (``StoreUnavailable``) inside a transaction of the project's, which would make
        the step durable only at its own COMMIT."""
        if self._inner is not None:
            with self._inner.phase():
                yield
            return
        assert self.state is State.RUNNING, self.state
        connection, database = self._connection_of(), self.attempt.database
        if self._atomic is None:
            own = transactions.starts_transaction(connection) or (
                transactions.only_testcase_blocks(connection)
            )
        else:
            own = transactions.innermost_block(connection) is self._atomic and (
                self._outermost or transactions.only_testcase_outside(connection)
            )
        if not own:
            raise StoreUnavailable(STEPS_NEED_COMMITS)
        with transaction.atomic(using=database):
            yield
            # A block marked for rollback would roll the step back at its end, silently,
            # its record with it, while the view goes on as if it were done.
            if transactions.marked_for_rollback(connection):
                raise StoreUnavailable(STEP_ROLLED_BACK)
        if self._atomic is None:
            return  # the block above was the transaction: committed
        if self._guard is not None:
            self._guard.check()
        if transactions.marked_for_rollback(connection):
            raise StoreUnavailable(STEP_ROLLED_BACK)
        atomic, self._atomic = self._atomic, None
        with bounded(connection):  # DATABASE_TIMEOUT: a COMMIT not answered is unknown
            atomic.__exit__(None, None, None)  # COMMIT (in a TestCase: RELEASE SAVEPOINT)
        self._begin()

    def _connection_of(self) -> Any:
        if self._connection is None:
            self._connection = connections[self.attempt.database]
        return self._connection

    def release(self) -> None:
        """Roll the view's writes back; the key is given back once the transaction has
        ended. ``DatabaseMisconfigured`` (after that) when a write of the view to another
        database was refused."""
        if self._inner is not None:
            return self._inner.release()
        assert self.state is State.RUNNING, self.state
        self._move(State.RELEASED)
        if self._atomic is not None:
            transaction.set_rollback(True, using=self.attempt.database)
        if self._guard is not None:
            self._guard.check()
        return None

    def _end_after_folded_commit(self) -> None:
        """The claim's store has committed the transaction in its own round trip: end
        Django's block now, so that nothing runs in it after COMMIT. Its COMMIT finds
        nothing to commit, autocommit comes back, then the view's ``on_commit`` hooks
        run; a hook's error is raised at the exit, as when COMMIT is there."""
        atomic, self._atomic = self._atomic, None
        try:
            atomic.__exit__(None, None, None)
        except BaseException as exc:
            self._hook_error = exc

    # -- exit ----------------------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._inner is not None:
            return bool(self._inner.__exit__(exc_type, exc, tb))
        claim = self.claim
        if claim is None or self.state in (State.SETTLED, State.GIVEN_BACK):
            return None  # no claim, or none that outlived __enter__
        given = exc
        refused = self._close_guard(exc)
        if refused is not None:
            exc_type, exc, tb = type(refused), refused, refused.__traceback__
        error = self._end_transaction(exc_type, exc, tb)
        self._settle(claim, error)
        if error is not None and error is not given:
            raise error
        return None

    def _end_transaction(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> BaseException | None:
        """End the view's transaction (when still open); the error the lifecycle ends on."""
        error = exc
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            try:
                self._end(atomic, exc_type, exc, tb)
            except BaseException as raised:
                error = raised
        elif self._hook_error is not None and error is None:
            error, self._hook_error = self._hook_error, None
        return error

    def _settle(self, claim: Claim, error: BaseException | None) -> None:
        """The final state, and what the claim does to reach it."""
        state = self.state
        if state is State.COMMITTED:
            # Durable: nothing may delete or rewrite the record now.
            claim.after_commit()
        elif isinstance(error, LeaseLost):
            self._move(State.LOST)
            claim.lost()
        elif self._commit_unknown and state is State.COMPLETED:
            # Not given back: the transaction may have committed (the claim decides).
            self._move(State.UNKNOWN)
            claim.commit_unknown()
        elif error is not None:
            self._move(State.GIVEN_BACK)
            claim.discard()
        elif state is State.PENDING:
            assert self._pending is not None
            self._store_pending(claim, self._pending)
        elif state is State.COMPLETED:
            # The block was nested in the project's transaction: the response is durable
            # when that commits (in a TestCase: when its savepoint is released).
            self._move(State.AWAITING_OUTER_COMMIT)
            self._after_outer_commit(claim)
        else:  # RELEASED, or RUNNING and neither completed nor released: nothing is kept
            self._move(State.GIVEN_BACK)
            claim.release()

    def _close_guard(self, exc: BaseException | None) -> DatabaseMisconfigured | None:
        """Take the write guard off the other databases' connections (the hooks that run
        after COMMIT are not the view). When it refused a write and the view went on (it
        caught the refusal, or raised something else), the refusal is what ends the
        lifecycle: the transaction rolls back and the key is given back."""
        guard, self._guard = self._guard, None
        if guard is None:
            return None
        guard.close()
        if (
            guard.refused is None
            or isinstance(exc, DatabaseMisconfigured)
            or self.state is State.COMMITTED
        ):
            return None
        refused = DatabaseMisconfigured()
        refused.__cause__ = exc if exc is not None else guard.refused
        return refused

    def _end(
        self,
        atomic: Any,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End the lifecycle's block, moving to COMMITTED when it made the completion
        durable, without an ``on_commit`` callback of the library's (which the view's tests
        would see among theirs).

        * Outermost: the view's hooks are held back while Django's block COMMITs (or rolls
          back); once COMMIT has returned the key is committed, then the hooks run as
          Django runs them (an error of theirs propagates; a rollback drops them).
        * Nested only in a ``TestCase``'s blocks: that test never commits; the end of this
          block is where production COMMITs, so a block released without a rollback
          counts as committed (the test's rollback undoes the database rows).
        * Nested in a transaction of the project's (``ATOMIC_REQUESTS``, an atomic block
          of its own): durable only at that COMMIT (see :meth:`_after_outer_commit`).
        """
        connection = self._connection
        commits = exc_type is None and transactions.will_commit(connection)
        if not self._outermost:
            in_test_only = transactions.only_testcase_outside(connection)
            atomic.__exit__(exc_type, exc, tb)  # RELEASE (or ROLLBACK TO) SAVEPOINT
            released = commits and in_test_only and not transactions.marked_for_rollback(connection)
            if released and self.state is State.COMPLETED:
                self._move(State.COMMITTED)
            return
        hooks = transactions.take_commit_hooks(connection)
        try:
            with bounded(connection):  # DATABASE_TIMEOUT: a COMMIT not answered is unknown
                atomic.__exit__(exc_type, exc, tb)  # COMMIT or ROLLBACK
        except BaseException as raised:
            hooks.clear()  # the COMMIT failed or was cut: Django drops the hooks
            # No answer to the COMMIT (a lost connection, DATABASE_TIMEOUT's cut): it may
            # have committed; an error the server answered rolled it back.
            self._commit_unknown = commits and is_connection_lost(raised)
            raise
        if not commits:
            return
        if self.state is State.COMPLETED:
            self._move(State.COMMITTED)  # COMMIT returned: nothing may touch the record now
        transactions.run_commit_hooks(connection, hooks)  # the view's, in Django's way

    def _after_outer_commit(self, claim: Claim) -> None:
        """Run ``after_commit()`` when the transaction around the lifecycle's commits: the
        library's one ``on_commit`` callback, or, inside a ``TestCase``, none (see
        :mod:`~django_idempotency.protocol.testcase`)."""
        connection = self._connection
        sid = None if connection is None else transactions.testcase_commit_point(connection)
        if sid is None:
            transaction.on_commit(claim.after_commit, using=self.attempt.database)
        else:
            testcase.defer_to_release(connection, sid, claim.after_commit)

    def _store_pending(self, claim: Claim, response: StoredResponse) -> None:
        try:
            stored = claim.store_pending(response)
        except LeaseLost:
            self._move(State.LOST)
            claim.lost()
            return
        except BaseException:
            self._move(State.GIVEN_BACK)
            claim.discard()
            raise
        if stored:
            self._move(State.COMMITTED)
            claim.after_commit()
            return
        self._move(State.SUPERSEDED)
        logger.info(
            "idempotency key %s (scope %s): another execution completed it while this "
            "request's writes were rolled back; its record is kept",
            self.attempt.key,
            self.attempt.scope,
        )


def refuse_manual_transactions(connection: Any, database: str) -> None:
    """Refuse a connection in manual transaction management (``set_autocommit(False)``),
    before anything is claimed: there is no ``on_commit`` there, so the lifecycle could
    never tell when the response is durable. An unconnected connection is not in it (and
    its ``autocommit`` is not read yet: reading it would connect)."""
    if (
        connection.connection is not None
        and not connection.autocommit
        and not connection.in_atomic_block
    ):
        raise transaction.TransactionManagementError(
            "django-idempotency cannot run a view in manual transaction management "
            f"(set_autocommit(False) on {database!r}): run it in autocommit "
            "or inside transaction.atomic()."
        )
