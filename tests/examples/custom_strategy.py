"""A third-party strategy, written from docs/api.md ("Writing a strategy").

Its records live in the memory of one process, behind one lock: enough for a
test settings file or a single-process deployment, and short enough to show the
whole interface. The lifecycle (transaction, pending stores, giving the key
back, hooks after COMMIT) is the protocol's (``protocol.lifecycle``); the fault
matrix runs it like the built-ins.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.strategies.base import (
    Attempt,
    Claim,
    InProgress,
    Mismatch,
    Outcome,
    Replay,
    Strategy,
)


@dataclass
class Record:
    fingerprint: str
    token: str
    until: float  # the lease while in progress, the TTL once completed
    response: StoredResponse | None = None


class MemoryClaim(Claim):
    def __init__(
        self, strategy: MemoryStrategy, attempt: Attempt, token: str
    ) -> None:
        super().__init__(attempt)
        self.strategy = strategy
        self.token = token

    def renew(self) -> bool:
        with self.strategy.lock:
            record = self.strategy.mine(self.attempt, self.token)
            if record is None:
                return False
            record.until = time.monotonic() + self.attempt.lock_timeout
            return True

    def store(self, response: StoredResponse, *, commit: bool) -> None:
        from django_idempotency.errors import LeaseLost

        with self.strategy.lock:
            record = self.strategy.mine(self.attempt, self.token)
            if record is None:
                raise LeaseLost()  # taken over: the session rolls the view back
            record.response = response
            record.until = time.monotonic() + self.attempt.ttl

    def release(self) -> bool:
        with self.strategy.lock:
            record = self.strategy.mine(self.attempt, self.token)
            if record is None:
                return False
            del self.strategy.records[(self.attempt.scope, self.attempt.key)]
            return True

    def discard(self) -> None:
        # The completion lives outside the database: undo it when COMMIT did not
        # happen.
        with self.strategy.lock:
            record = self.strategy.records.get(
                (self.attempt.scope, self.attempt.key)
            )
            if record is not None and record.token == self.token:
                del self.strategy.records[
                    (self.attempt.scope, self.attempt.key)
                ]


class MemoryStrategy(Strategy):
    name = "memory"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[tuple[str, str], Record] = {}

    def claim(self, attempt: Attempt) -> Outcome:
        now = time.monotonic()
        with self.lock:
            record = self.records.get((attempt.scope, attempt.key))
            if record is None or record.until <= now:
                token = uuid.uuid4().hex
                self.records[(attempt.scope, attempt.key)] = Record(
                    attempt.fingerprint, token, now + attempt.lock_timeout
                )
                return MemoryClaim(self, attempt, token)
            if record.fingerprint != attempt.fingerprint:
                return Mismatch()
            if record.response is None:
                return InProgress()
            return Replay(record.response)

    def mine(self, attempt: Attempt, token: str) -> Record | None:
        """The in-progress record of ``attempt`` while ``token`` holds it (under
        the lock)."""
        record = self.records.get((attempt.scope, attempt.key))
        if (
            record is None
            or record.token != token
            or record.response is not None
        ):
            return None
        return record
