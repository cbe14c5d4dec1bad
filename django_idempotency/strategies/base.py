"""The Strategy interface: what a strategy implements, and the outcomes of a claim.

A strategy implements :meth:`Strategy.claim`: it claims the key of one attempt and
returns an outcome:

* a :class:`Claim` — this request owns the key; the view runs, and the claim stores
  its response or gives the key back;
* :class:`InProgress` — another request holds the key (409);
* :class:`Replay` — the key completed; here is the stored response;
* :class:`Mismatch` — the key was used for a different request (422);
* :class:`Delegate` — another strategy handles this attempt (a fallback).

The attempt and the outcomes that are values (``InProgress``, ``Replay``, ``Mismatch``)
live in :mod:`django_idempotency.values`, which every layer shares; they are named here
too, where a strategy's author looks for them.

``protocol.lifecycle.Lifecycle`` owns everything else, once for all strategies: the
transaction around the view, when the claim stores and when it gives the key back. See
docs/how-it-works.md and docs/api.md ("Writing a strategy").
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError, transaction
from django.utils.translation import gettext_lazy as _

from ..store.errors import is_connection_lost, is_transient, store_unavailable
from ..values.attempt import Attempt
from ..values.outcomes import InProgress, Mismatch, Outcome, Replay
from ..values.response import StoredResponse

if TYPE_CHECKING:
    from .waiting import Listener

logger = logging.getLogger("django_idempotency")


#: The detail of a 503 for a response that could not be stored.
NOT_STORED_DETAIL = _(
    "The response could not be stored, so this request's changes were rolled back. "
    "Retry with the same Idempotency-Key."
)


def store_failed(exc: DatabaseError, *, committing: bool) -> BaseException:
    """What a store that failed with ``exc`` raises: ``StoreUnavailable`` (a 503; the
    view's writes are rolled back). When its statement also ran the COMMIT
    (``Claim.store(commit=True)``), a lost connection or a transient
    conflict is raised as it is, so that the client gets the answer a failed COMMIT gets
    (``database-unavailable``, ``transient-conflict``)."""
    if committing and (is_connection_lost(exc) or is_transient(exc)):
        return exc
    return store_unavailable(exc, NOT_STORED_DETAIL)


@dataclass(frozen=True)
class Delegate(Outcome):
    """Hand the attempt to ``strategy`` (e.g. the ``db`` strategy while Redis is down)."""

    strategy: Strategy


class Claim(Outcome, abc.ABC):
    """This request owns the key until the lifecycle completes or releases it.

    A strategy implements :meth:`renew`, :meth:`store` and :meth:`release`, and may
    override the hooks :meth:`settled`, :meth:`store_pending`, :meth:`discard`,
    :meth:`after_commit` and :meth:`lost`. It never sees the view's transaction:
    ``protocol.lifecycle.Lifecycle`` opens and ends it, and calls these.
    """

    #: True when the claim replaced a stale lease or an expired record.
    taken_over: bool = False
    #: Whether ``renew`` extends a lease (a heartbeat keeps it alive while the view runs).
    renewable: bool = True
    #: Whether :meth:`store` can also COMMIT the view's transaction in its own statement's
    #: round trip (``store(commit=True)``; see ``store.sql.postgresql.and_commit``).
    folds_commit: bool = False

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt

    @property
    def label(self) -> str:
        return "taken_over" if self.taken_over else "claimed"

    # -- what a strategy implements --------------------------------------------------------

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the lease. False means the claim was lost."""

    @abc.abstractmethod
    def store(self, response: StoredResponse, *, commit: bool) -> None:
        """Write the completed record, fenced by this claim, in the view's transaction;
        ``LeaseLost`` when the claim is no longer ours, ``StoreUnavailable`` when the store
        failed. ``commit`` (only for a claim that :attr:`folds_commit`): the statement also
        COMMITs the transaction, and raises when it stored nothing, with nothing committed."""

    @abc.abstractmethod
    def release(self) -> bool:
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
        (whether it was stored). The default suits a claim whose ``store`` is fenced
        by its token."""
        with transaction.atomic(using=self.attempt.database):
            self.store(response, commit=False)
        return True

    def discard(self) -> None:
        """The transaction did not commit: undo whatever of this claim is outside it
        (a completion written to another store before COMMIT) and give the key back."""
        self.release()

    def commit_unknown(self) -> None:
        """COMMIT was sent and its answer never came (a lost connection, ``DATABASE_TIMEOUT``):
        the transaction may have committed. The default is :meth:`discard`, right for a
        claim whose record commits with the transaction (it gives back only a claim still
        in progress); a claim that wrote outside it keeps what a retry must settle."""
        self.discard()

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

    #: Completed responses pass through ``IdempotencyOutbox`` (``hybrid``); the admin lists
    #: the outbox only under such a strategy, or while it holds rows.
    uses_outbox: bool = False

    #: The claim itself waits for the key's holder (``advisory_lock``: the lock wait,
    #: bounded by ``attempt.wait``); the engine then does not wait again after it.
    waits_in_claim: bool = False

    def listener(self, attempt: Attempt) -> Listener | None:
        """What wakes the duplicates waiting for ``attempt``'s key in this process
        (see ``django_idempotency.strategies.waiting``); None: they poll. Must not raise."""
        return None


__all__ = [
    "NOT_STORED_DETAIL",
    "Attempt",
    "Claim",
    "Delegate",
    "InProgress",
    "Mismatch",
    "Outcome",
    "Replay",
    "StoredResponse",
    "Strategy",
    "store_failed",
]
