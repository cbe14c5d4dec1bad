"""A shop's own project, as its developers write it, for the tests that run its test suite
in a process of its own (tests/system/test_user_test_suites.py, tests/system/test_dist.py):
the ``redis`` strategy and a DRF view, and two tests that send one fixed key for a user who
gets the same primary key in each (the test's rollback resets SQLite's sequence). Without
isolation the second test's POST is a replay of the first test's answer and creates nothing.

The suites never heard of ``django_idempotency.testing``: ``test_charges.py`` (pytest-django)
and ``payments/tests.py`` (``APITestCase``, for ``manage.py test``). The settings read
``SHOP_REDIS_URL`` and ``SHOP_PREFIX``; ``SHOP_TEST_ISOLATION=0`` sets ``TEST_ISOLATION``
off and ``SHOP_SHARED_MARK=1`` marks the pytest tests ``idempotency_shared_store``.
"""

from __future__ import annotations

from pathlib import Path

SHOP = {
    "manage.py": """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
""",
    "pytest.ini": "[pytest]\nDJANGO_SETTINGS_MODULE = shop.settings\n",
    "shop/__init__.py": "",
    "shop/settings.py": """
import os
SECRET_KEY = "shop"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.auth", "django.contrib.contenttypes", "rest_framework",
    "django_idempotency", "payments",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.sqlite3"}}
ROOT_URLCONF = "shop.urls"
IDEMPOTENCY = {
    "STRATEGY": "redis",
    "REDIS_URL": os.environ["SHOP_REDIS_URL"],
    "REDIS_KEY_PREFIX": os.environ["SHOP_PREFIX"],
    "TEST_ISOLATION": os.environ.get("SHOP_TEST_ISOLATION", "1") == "1",
}
""",
    "shop/urls.py": """
from django.urls import path
from payments.views import ChargeCreate
urlpatterns = [path("charges/", ChargeCreate.as_view())]
""",
    "payments/__init__.py": "",
    "payments/models.py": """
from django.conf import settings
from django.db import models

class Charge(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    amount = models.IntegerField()
""",
    "payments/views.py": """
from rest_framework import generics, serializers
from rest_framework.permissions import IsAuthenticated
from django_idempotency.mixins import IdempotencyMixin
from .models import Charge

class ChargeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Charge
        fields = ["id", "amount"]

class ChargeCreate(IdempotencyMixin, generics.CreateAPIView):
    serializer_class = ChargeSerializer
    permission_classes = [IsAuthenticated]

    def perform_create(self, serializer):
        serializer.save(user=self.request.user)
""",
    # pytest-django, plain functions
    "test_charges.py": """
import os
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient
from payments.models import Charge

if os.environ.get("SHOP_SHARED_MARK") == "1":
    pytestmark = pytest.mark.idempotency_shared_store

def charge_once():
    client = APIClient()
    client.force_authenticate(User.objects.create_user("payer"))
    response = client.post("/charges/", {"amount": 5}, format="json",
                           HTTP_IDEMPOTENCY_KEY="order-1")
    assert response.status_code == 201
    assert Charge.objects.count() == 1, "a replay of the earlier test's charge"

@pytest.mark.django_db
def test_first():
    charge_once()

@pytest.mark.django_db
def test_second():
    charge_once()
""",
    # Django's test runner, DRF's APITestCase
    "payments/tests.py": """
from django.contrib.auth.models import User
from rest_framework.test import APITestCase
from .models import Charge

class ChargeTests(APITestCase):
    def charge_once(self):
        self.client.force_authenticate(User.objects.create_user("payer"))
        response = self.client.post("/charges/", {"amount": 5}, format="json",
                                    headers={"idempotency-key": "order-1"})
        self.assertEqual(response.status_code, 201)
        self.assertEqual(Charge.objects.count(), 1, "a replay of the earlier test's charge")

    def test_first(self):
        self.charge_once()

    def test_second(self):
        self.charge_once()
""",
}


def write_shop(folder: Path) -> Path:
    """The shop's files in ``folder``; ``folder``."""
    for name, text in SHOP.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text.lstrip(), encoding="utf-8")
    return folder
