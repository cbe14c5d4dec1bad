"""factory-boy factories: users with API tokens, IdempotencyKey rows in each state, and
IdempotencyOutbox rows (the ``hybrid`` strategy's pending responses).

Rows are created on the database alias given as ``_using`` (or the default one)::

    IdempotencyKeyFactory(_using="sqlite")
    CompletedKeyFactory(response_body=b'{"ok": true}')
    StaleKeyFactory(locked_at=...)
    IdempotencyOutbox.objects.bulk_create(IdempotencyOutboxFactory.build_batch(1000))
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from django_idempotency.models import IdempotencyKey, IdempotencyOutbox


class UserFactory(factory.django.DjangoModelFactory):
    """A user with a DRF token; ``user.auth_token.key`` is the API token."""

    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("secret")

    @factory.post_generation
    def token(self, create: bool, extracted: str | None, **kwargs: Any) -> None:
        if not create:
            return
        using = self._state.db or "default"
        Token.objects.using(using).filter(user=self).delete()
        Token.objects.using(using).create(user=self, key=extracted or uuid.uuid4().hex)


class IdempotencyKeyFactory(factory.django.DjangoModelFactory):
    """An in-progress claim with a fresh lease."""

    class Meta:
        model = IdempotencyKey

    scope = factory.Sequence(lambda n: f"user:{n}")
    key = factory.LazyFunction(lambda: uuid.uuid4().hex)
    fingerprint = factory.Sequence(lambda n: f"{n:064x}")
    status = IdempotencyKey.Status.IN_PROGRESS
    claim_token = factory.LazyFunction(uuid.uuid4)
    locked_at = factory.LazyFunction(timezone.now)
    request_method = "POST"
    request_path = "/api/charges/"
    created_at = factory.LazyFunction(timezone.now)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=24))

    @classmethod
    def _create(cls, model_class: type[IdempotencyKey], *args: Any, **kwargs: Any) -> Any:
        using = kwargs.pop("_using", None) or "default"
        return model_class.objects.using(using).create(*args, **kwargs)


class CompletedKeyFactory(IdempotencyKeyFactory):
    """A completed key with a stored ``201`` JSON response."""

    status = IdempotencyKey.Status.COMPLETED
    locked_at = None
    response_status = 201
    response_headers = factory.LazyFunction(
        lambda: {"Content-Type": "application/json", "Location": "/api/charges/1/"}
    )
    response_body = factory.LazyFunction(lambda: json.dumps({"id": 1, "amount": 100}).encode())
    completed_at = factory.LazyFunction(timezone.now)


class StaleKeyFactory(IdempotencyKeyFactory):
    """An in-progress claim whose lease was last renewed an hour ago (a crashed owner)."""

    locked_at = factory.LazyFunction(lambda: timezone.now() - timedelta(hours=1))
    created_at = factory.LazyFunction(lambda: timezone.now() - timedelta(hours=1))


class ExpiredKeyFactory(CompletedKeyFactory):
    """A completed key whose time to live is over."""

    created_at = factory.LazyFunction(lambda: timezone.now() - timedelta(days=2))
    completed_at = factory.LazyFunction(lambda: timezone.now() - timedelta(days=2))
    expires_at = factory.LazyFunction(lambda: timezone.now() - timedelta(days=1))


class IdempotencyOutboxFactory(factory.django.DjangoModelFactory):
    """A completed ``201`` JSON response waiting in the outbox for an hour."""

    class Meta:
        model = IdempotencyOutbox

    scope = "user:1"
    key = factory.LazyFunction(lambda: uuid.uuid4().hex)
    fingerprint = factory.Sequence(lambda n: f"{n:064x}")
    request_method = "POST"
    request_path = "/api/charges/"
    response_status = 201
    response_headers = factory.LazyFunction(lambda: {"Content-Type": "application/json"})
    response_body = factory.LazyFunction(lambda: json.dumps({"id": 1, "amount": 100}).encode())
    created_at = factory.LazyFunction(timezone.now)
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))

    @classmethod
    def _create(cls, model_class: type[IdempotencyOutbox], *args: Any, **kwargs: Any) -> Any:
        using = kwargs.pop("_using", None) or "default"
        return model_class.objects.using(using).create(*args, **kwargs)
