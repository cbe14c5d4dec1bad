"""docs/testing.md's APITestCase example under the redis and hybrid
strategies, and the receipts its view sends (once per charge, retries or
not)."""

import pytest
from django.test import override_settings

from tests.support import services

from . import receipts
from . import test_testing_apitestcase as example


def redis_settings(strategy: str) -> dict[str, str]:
    return {
        "STRATEGY": strategy,
        "REDIS_URL": services.REDIS_URL,
        "REDIS_KEY_PREFIX": "docs",
    }


class ReceiptsTests(example.ChargeTests):
    def test_the_receipt_went_out_once(self) -> None:
        receipts.sent_receipts.clear()
        with self.captureOnCommitCallbacks(execute=True):
            first = self.charge("order-2")
        assert self.charge("order-2").json() == first.json()
        assert receipts.sent_receipts == [first.json()["id"]]


@pytest.mark.redis
@override_settings(IDEMPOTENCY=redis_settings("redis"))
class TestOnRedis(ReceiptsTests):
    pass


@pytest.mark.redis
@pytest.mark.postgres
@override_settings(IDEMPOTENCY=redis_settings("hybrid"))
class TestOnHybrid(ReceiptsTests):
    pass


@pytest.mark.redis
@override_settings(IDEMPOTENCY=redis_settings("redis"))
class TestWithoutRedisUnderARedisProject(example.ChargeTestsWithoutRedis):
    """``idempotency_strategy = "db"`` wins over the project's redis
    strategy."""

    def test_no_record_reaches_redis(self) -> None:
        from django_idempotency.strategies import get_strategy

        assert get_strategy().name == "db"
