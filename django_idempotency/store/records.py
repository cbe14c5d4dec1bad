"""What the managers return about a key: the claim's outcome, a row, a record, a drain.

One row shape, :class:`KeyRow`, as the SQL reads it; :class:`KeyRecord` is that row seen
by the ``hybrid`` strategy (docs/hybrid.md), and :func:`kept_ttl` says when the completion
keeps the claim's expiry. The
reference is docs/api.md ("The model and its manager").
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import NamedTuple

from django.utils import timezone

from ..values.response import StoredResponse
from .status import COMPLETED


class ClaimState(Enum):
    CLAIMED = "claimed"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class ClaimResult:
    state: ClaimState
    pk: int | None = None
    token: uuid.UUID | None = None
    taken_over: bool = False
    response: StoredResponse | None = None


#: The columns of a read, the fields of :class:`KeyRow` (less ``from_outbox``).
READ_COLUMNS = (
    "id",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
)


class KeyRow(NamedTuple):
    """One IdempotencyKey row as :meth:`IdempotencyKeyManager.read` returns it, or a live
    row of the hybrid strategy's outbox, as a completed key (``from_outbox``: its ``pk`` is
    the outbox row's, and it has no claim token)."""

    pk: int
    fingerprint: str
    status: str
    claim_token: uuid.UUID | None
    locked_at: datetime | None
    expires_at: datetime
    response_status: int | None
    response_headers: dict[str, str] | None
    response_body: bytes | None
    from_outbox: bool = False

    def stored_response(self) -> StoredResponse:
        """The response the row keeps (read it only from a completed row)."""
        return StoredResponse.from_row(
            self.response_status, self.response_headers, self.response_body
        )


#: The share of the TTL by which the completion may leave a key's expiry where its claim
#: put it (the claim's now plus TTL) rather than move it to the completion's now plus TTL.
#: A request that completes within 1 % of the TTL of its claim (864 s of a day) keeps it:
#: the completion then changes no indexed column, and PostgreSQL can update the row on its
#: heap page without a new index entry (a HOT update). A completed key is therefore kept
#: for the TTL from its claim, and never less than 99 % of the TTL from its completion.
EXPIRY_SLACK = 0.01


def kept_ttl(ttl: float) -> float:
    """The least TTL, from the completion's now, at which the completion keeps the expiry
    the claim wrote (``store.sql.owner.complete``): ``ttl`` less :data:`EXPIRY_SLACK` of it."""
    return ttl * (1 - EXPIRY_SLACK)


@dataclass(frozen=True)
class KeyRecord:
    """What the database knows about one (scope, key): a row of IdempotencyKey or of the
    outbox, read by :meth:`IdempotencyOutboxManager.lookup`."""

    source: str  # "outbox" or "key"
    pk: int
    status: str
    fingerprint: str
    expires_at: datetime
    response: StoredResponse | None = None
    claim_token: uuid.UUID | None = None
    locked_at: datetime | None = None
    #: The database's now when the record was read (None where the app's clock is the
    #: database's: SQLite).
    read_at: datetime | None = None

    @classmethod
    def from_row(cls, row: KeyRow, read_at: datetime | None = None) -> KeyRecord:
        """The record of a row (read at ``read_at`` by the database's clock); a completed
        row's response, when it has one."""
        completed = row.status == COMPLETED and row.response_status is not None
        return cls(
            source="outbox" if row.from_outbox else "key",
            pk=row.pk,
            status=row.status,
            fingerprint=row.fingerprint,
            expires_at=row.expires_at,
            response=row.stored_response() if completed else None,
            claim_token=row.claim_token,
            locked_at=row.locked_at,
            read_at=read_at,
        )

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def ttl_seconds(self, now: datetime | None = None) -> float:
        """Seconds this record was still replayed when it was read, by the database's
        clock (``read_at``; the app's clock only where it is the database's, on SQLite):
        the TTL of a Redis refill, which an app server whose clock is off neither
        shortens nor lengthens."""
        at = now or self.read_at or timezone.now()
        return max((self.expires_at - at).total_seconds(), 0.0)


@dataclass(frozen=True)
class DrainResult:
    """One drain transaction: rows moved into IdempotencyKey, and expired rows dropped."""

    drained: int = 0
    discarded: int = 0
    #: Rows left for later: a short batch whose oldest row was younger than ``hold_partial``.
    held: int = 0

    @property
    def rows(self) -> int:
        return self.drained + self.discarded
