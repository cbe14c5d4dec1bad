"""Schemathesis against the example API's OpenAPI schema, in process.

The schema is the one ``manage.py spectacular`` writes for the example project (the example
with ``drf_spectacular`` installed, as ``tests/contrib/test_spectacular.py`` builds it): its
``/api/`` operations, documented by ``django_idempotency.contrib.spectacular``. Schemathesis
generates requests from it, valid and invalid (``Idempotency-Key`` values from the header's patterns
too), sends them to the test project's WSGI application with a demo user's token, and checks
each answer against the schema: a status it declares, a content type it declares for that
status, the headers it declares (``Retry-After``, ``Idempotent-Replayed``), a body that
matches that schema, and never a 5xx. No network: the requests go
straight into the WSGI application.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import django_idempotency.contrib.spectacular  # noqa: F401  (registers the extension)
from example_project import urls as example_urls

from ..support.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

#: What each answer is checked for. Not schemathesis' positive_data_acceptance: the
#: examples reuse keys, and the same key with another valid body is rightly a 422.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
#: Examples per operation: about 10 s for the example API's two operations.
EXAMPLES = 100
SPECTACULAR = {
    **settings.REST_FRAMEWORK,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}


def example_schema() -> dict[str, Any]:
    """The example project's OpenAPI document, for its ``/api/`` routes."""
    with override_settings(REST_FRAMEWORK=SPECTACULAR):
        document: dict[str, Any] = SchemaGenerator(patterns=example_urls.urlpatterns).get_schema(
            request=None, public=True
        )
    document["paths"] = {
        route: item for route, item in document["paths"].items() if route.startswith("/api/")
    }
    return document


# Loaded when the module is imported (the settings are configured by then; no database is
# needed), not through schemathesis.pytest.from_fixture, whose lazy loading sets a private
# attribute of pytest's test items that pytest 9.2 no longer has.
schema = schemathesis.openapi.from_dict(example_schema())
schema.app = get_wsgi_application()


@pytest.fixture
def token() -> str:
    return str(UserFactory(username="alice").auth_token.key)


@schema.parametrize()
@hypothesis_settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_example_api_answers_as_its_schema_says(case: Any, token: str) -> None:
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)
