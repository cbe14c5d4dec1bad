"""``IdempotencySuspect.objects``: the keys the ``hybrid`` strategy handled in the database
alone, kept in the key's database so that every process learns of them.

A key that fell back to the ``db`` strategy while Redis refused it, or whose completed record
Redis did not take after its commit, has no record in Redis: its next claim there would win
and run the view again. The process that handled it remembers it and, once Redis answers,
writes its suspect mark there (``strategies/redis/suspects.py``); the row written here is
what outlives that process (a restart during the episode) and what the other processes read
(``HybridStrategy``, at most once a second each): whichever of them next reaches Redis
writes the marks and deletes the rows. Times come from the database's clock
(``store/clock.py``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple, TypeVar

from django.db import connections, models
from django.db.models import Q

from ..values.keys import key_digest
from .clock import DatabaseNow, database_now, database_time

#: The manager's model: IdempotencySuspect (named by the models module, not imported here).
_Suspect = TypeVar("_Suspect", bound=models.Model)


class SuspectRow(NamedTuple):
    """One row, as a process holds it: where it lives, its name and its expiry."""

    database: str
    digest: str
    expires_at: datetime


class LiveSuspect(NamedTuple):
    """A row that may still live: its (Redis) scope and key, and for how long."""

    scope: str
    key: str
    seconds: float
    row: SuspectRow


class IdempotencySuspectManager(models.Manager[_Suspect]):
    """Note a key, read the live ones, delete those whose marks Redis holds."""

    def note(self, scope: str, key: str, seconds: float, *, using: str) -> SuspectRow:
        """Remember (``scope``, ``key``) until ``seconds`` from the database's now: one
        upsert on the key's name (a later note of the key sets its expiry)."""
        expires_at = database_now(connections[using]) + timedelta(seconds=seconds)
        digest = key_digest(scope, key)
        row = self.model(digest=digest, scope=scope, key=key, expires_at=expires_at)
        # MariaDB and MySQL name no conflict target (ON DUPLICATE KEY: the one unique key).
        target = (
            ["digest"]
            if connections[using].features.supports_update_conflicts_with_target
            else None
        )
        self.db_manager(using).bulk_create(
            [row], update_conflicts=True, unique_fields=target, update_fields=["expires_at"]
        )
        return SuspectRow(using, digest, expires_at)

    def live(self, *, using: str) -> list[LiveSuspect]:
        """The rows that have not expired by the database's clock: one ``SELECT`` when
        there are none (the steady state), and one more for the database's now."""
        rows = list(
            self.using(using)
            .filter(expires_at__gt=DatabaseNow())
            .values_list("digest", "scope", "key", "expires_at")
        )
        if not rows:
            return []
        now = database_now(connections[using])
        live = []
        for digest, scope, key, expires_at in rows:
            expires_at = database_time(expires_at)
            seconds = (expires_at - now).total_seconds()
            live.append(LiveSuspect(scope, key, seconds, SuspectRow(using, digest, expires_at)))
        return live

    def settle(self, rows: list[SuspectRow]) -> int:
        """Delete ``rows``, whose marks Redis now holds: each only while its expiry is still
        the one its mark was written for (a row noted again since then stays)."""
        deleted = 0
        for using in {row.database for row in rows}:
            match = Q()
            for row in rows:
                if row.database == using:
                    match |= Q(digest=row.digest, expires_at__lte=row.expires_at)
            deleted += self.using(using).filter(match).delete()[0]
        return deleted

    def delete_expired(self, *, using: str) -> int:
        """Delete the rows that expired by the database's clock (the purge)."""
        return self.using(using).filter(expires_at__lte=DatabaseNow()).delete()[0]
