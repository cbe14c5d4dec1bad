"""docs/testing.md's APITestCase example; test_testing_strategies.py runs it
under the redis and hybrid strategies too."""

# --8<-- [start:example]
from django.contrib.auth.models import User
from rest_framework.test import APITestCase

from django_idempotency.testing import IdempotencyTestMixin

from .models import Charge


class ChargeTests(APITestCase):
    def setUp(self):
        self.client.force_authenticate(User.objects.create_user("payer"))

    def charge(self, key):
        body = {"amount": 500, "currency": "eur"}
        return self.client.post(
            "/ex/receipt/drf/",
            body,
            format="json",
            headers={"Idempotency-Key": key},
        )

    def test_a_retry_replays_and_charges_once(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            first = self.charge("order-1")
        assert first.status_code == 201
        assert len(callbacks) == 1  # the view's receipt; the library adds none

        retry = self.charge("order-1")
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert retry.json() == first.json()
        assert Charge.objects.count() == 1

    def test_the_same_key_in_the_next_test_charges_again(self):
        response = self.charge("order-1")
        assert response.status_code == 201
        assert "Idempotent-Replayed" not in response.headers


class ChargeTestsWithoutRedis(IdempotencyTestMixin, APITestCase):
    """Unit tests that need no Redis: the db strategy, rolled back with the
    test."""

    idempotency_strategy = "db"

    def test_a_charge(self):
        self.client.force_authenticate(User.objects.create_user("payer"))
        body = {"amount": 500, "currency": "eur"}
        response = self.client.post(
            "/ex/receipt/drf/",
            body,
            format="json",
            headers={"Idempotency-Key": "order-1"},
        )
        assert response.status_code == 201


# --8<-- [end:example]
