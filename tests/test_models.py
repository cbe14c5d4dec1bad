"""The IdempotencyKey model: migrations in step, the (scope, key) constraint in the database."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from django_idempotency.models import IdempotencyKey

from .support.factories import CompletedKeyFactory, ExpiredKeyFactory, IdempotencyKeyFactory

pytestmark = pytest.mark.django_db


def test_migrations_are_in_step_with_the_models() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.postgres
def test_the_key_table_leaves_room_on_its_pages_for_the_completion() -> None:
    """fillfactor 80 on PostgreSQL: the completed row version fits on the page of its claim
    (a HOT update)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
            [IdempotencyKey._meta.db_table],
        )
        assert cursor.fetchone()[0] == ["fillfactor=80"]


@pytest.mark.django_db(databases=["default", "sqlite"])
@pytest.mark.parametrize("alias", ["default", "sqlite"])
def test_scope_and_key_are_unique_in_the_database(alias: str) -> None:
    IdempotencyKeyFactory(_using=alias, scope="user:1", key="k")
    # bulk_create skips model validation: the database itself must refuse the row
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        IdempotencyKey.objects.using(alias).bulk_create(
            [IdempotencyKeyFactory.build(scope="user:1", key="k")]
        )
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        CompletedKeyFactory(_using=alias, scope="user:1", key="k")
    # the same key in another scope, and another key in the same scope, are fine
    IdempotencyKeyFactory(_using=alias, scope="user:2", key="k")
    IdempotencyKeyFactory(_using=alias, scope="user:1", key="K")
    assert IdempotencyKey.objects.using(alias).count() == 3


def test_is_expired_and_str() -> None:
    live = CompletedKeyFactory(scope="user:3", key="abc")
    expired = ExpiredKeyFactory()
    assert not live.is_expired
    assert expired.is_expired
    assert str(live) == "user:3 / abc"
    live.expires_at = timezone.now() - timedelta(seconds=1)
    assert live.is_expired


def test_binary_body_and_json_headers_round_trip() -> None:
    body = bytes(range(256))
    key = CompletedKeyFactory(response_body=body, response_headers={"Content-Type": "x/y"})
    fresh = IdempotencyKey.objects.get(pk=key.pk)
    assert fresh.response_body is not None and bytes(fresh.response_body) == body
    assert fresh.response_headers == {"Content-Type": "x/y"}
