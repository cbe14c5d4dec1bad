"""The Strategy interface: how a key is claimed, completed and released.

A strategy opens a *session* for one attempt. The session yields an outcome:

* :class:`Claimed` — this request owns the key; the view runs inside the
  session (for the database strategies, inside the transaction that will also
  store the response) and must end with ``complete()`` or ``release()``;
* :class:`InFlight` — another request holds the key (409);
* :class:`Replay` — the key completed; here is the stored response;
* :class:`Mismatch` — the key was used for a different request (422).

An exception that leaves the session while Claimed rolls back what the view
wrote (where the strategy owns a transaction) and releases the key.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from django.db import transaction

from ..responses import StoredResponse


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


class Outcome:
    """What a claim found."""


@dataclass(frozen=True)
class InFlight(Outcome):
    retry_after: int = 1


@dataclass(frozen=True)
class Replay(Outcome):
    response: StoredResponse


@dataclass(frozen=True)
class Mismatch(Outcome):
    pass


class Claimed(Outcome, abc.ABC):
    """This request owns the key until it completes or releases it."""

    #: True when the claim replaced a stale lease or an expired record.
    taken_over: bool = False
    #: Whether ``renew`` extends a lease (a heartbeat keeps it alive while the view runs).
    renewable: bool = True

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
    """A claim whose view runs in a database transaction that its session opens
    (``in_transaction``), and whose response is stored as part of that transaction.

    ``complete()`` stores the response at once, unless the view marked the transaction
    for rollback (DRF does after an ``APIException``): its writes are then undone, and
    the session stores the ``pending`` response once the transaction has ended.
    ``release()`` rolls the view's writes back, and the session then calls ``delete()``
    (at once, outside a transaction).
    """

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.in_transaction = False
        self.pending: StoredResponse | None = None
        self.released = False

    def complete(self, response: StoredResponse) -> None:
        if self.in_transaction and transaction.get_rollback(using=self.attempt.database):
            self.pending = response
            return
        self._store(response)

    @abc.abstractmethod
    def _store(self, response: StoredResponse) -> None:
        """Write the response; ``LeaseLost`` when the claim is no longer ours."""

    def release(self) -> None:
        self.released = True
        if self.in_transaction:
            # Undo the view's writes: a retry will run the view again.
            transaction.set_rollback(True, using=self.attempt.database)
        else:
            self.delete()

    @abc.abstractmethod
    def delete(self) -> bool:
        """Give the key back now, if it is still this claim's; whether it was."""


class Strategy(abc.ABC):
    """Base class of the claim strategies; subclasses are stateless and thread-safe."""

    name: str = ""

    @abc.abstractmethod
    def session(self, attempt: Attempt) -> AbstractContextManager[Outcome]:
        """Claim ``attempt``'s key and yield the outcome (see the module doc)."""

    def describe(self) -> str:
        return self.name


def iter_once(outcome: Outcome) -> Iterator[Outcome]:
    """Helper for sessions that have nothing to clean up."""
    yield outcome
