"""``IdempotencySuspect.objects`` on each vendor that holds keys: a note is one row per key
whose expiry a later note sets, the live rows come with the seconds they have left by the
database's clock, and only the rows a mark covers are deleted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_idempotency.models import IdempotencySuspect
from django_idempotency.store.suspects import SuspectRow

BACKENDS = [
    pytest.param("default", marks=pytest.mark.postgres, id="postgres"),
    "sqlite",
    pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb"),
]

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite", "mariadb"])


def _live(using: str) -> dict[str, float]:
    return {found.key: found.seconds for found in IdempotencySuspect.objects.live(using=using)}


@pytest.mark.parametrize("using", BACKENDS)
def test_a_key_is_noted_once_and_a_later_note_sets_its_expiry(using: str) -> None:
    suspects = IdempotencySuspect.objects
    assert suspects.live(using=using) == []
    first = suspects.note("user:1", "k", 600, using=using)
    suspects.note("user:1", "other", 60, using=using)
    assert 540 < _live(using)["k"] <= 600 and 0 < _live(using)["other"] <= 60
    again = suspects.note("user:1", "k", 1200, using=using)
    assert suspects.using(using).filter(key="k").count() == 1
    assert again.expires_at > first.expires_at and _live(using)["k"] > 600
    assert suspects.note("user:2", "k", 30, using=using).digest != first.digest


@pytest.mark.parametrize("using", BACKENDS)
def test_only_the_rows_a_mark_covers_are_deleted(using: str) -> None:
    suspects = IdempotencySuspect.objects
    marked = suspects.note("user:1", "marked", 600, using=using)
    older = suspects.note("user:1", "noted-again", 60, using=using)
    suspects.note("user:1", "noted-again", 600, using=using)  # after its mark was written
    assert suspects.settle([marked, older]) == 1
    assert set(_live(using)) == {"noted-again"}
    gone = SuspectRow(using, "no-such-digest", older.expires_at)
    assert suspects.settle([gone]) == 0


@pytest.mark.parametrize("using", BACKENDS)
def test_an_expired_row_is_not_live_and_the_purge_deletes_it(using: str) -> None:
    suspects = IdempotencySuspect.objects
    row = suspects.note("user:1", "old", 600, using=using)
    suspects.note("user:1", "young", 600, using=using)
    suspects.using(using).filter(digest=row.digest).update(
        expires_at=row.expires_at - timedelta(seconds=1200)
    )
    assert set(_live(using)) == {"young"}
    assert suspects.delete_expired(using=using) == 1
    assert suspects.using(using).count() == 1
