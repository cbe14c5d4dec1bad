"""No two callers share a scope by accident: credentials that reach the claim
unauthenticated are refused, an anonymous session is scoped by its cookie; and the
checks on where ``IdempotencyMixin`` sits in a view's bases."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, RequestFactory, override_settings
from django.views import View
from rest_framework import generics
from rest_framework.views import APIView

from django_idempotency.errors import (
    PROBLEM_BASE,
    CredentialsNotAuthenticated,
    IdempotencyError,
    InvalidKey,
    MisplacedIdempotencyMixin,
)
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.scope import default_scope

from ..support.api import post_json, replayed, token_client
from ..support.assertions import assert_problem
from ..support.factories import UserFactory
from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db

factory = RequestFactory()


def anonymous(request: HttpRequest) -> HttpRequest:
    from django.contrib.auth.models import AnonymousUser

    request.user = AnonymousUser()
    return request


# -- default_scope -------------------------------------------------------------------------


def test_an_anonymous_request_without_credentials_is_anonymous() -> None:
    assert default_scope(anonymous(factory.post("/"))) == "anonymous"


def test_an_unauthenticated_authorization_header_is_refused() -> None:
    request = anonymous(factory.post("/", HTTP_AUTHORIZATION="Token abc"))
    with pytest.raises(CredentialsNotAuthenticated):
        default_scope(request)


@override_settings(IDEMPOTENCY={"CREDENTIAL_HEADERS": ["X-Api-Key"]})
def test_the_credential_headers_are_a_setting() -> None:
    assert default_scope(anonymous(factory.post("/", HTTP_AUTHORIZATION="Basic x"))) == "anonymous"
    with pytest.raises(CredentialsNotAuthenticated):
        default_scope(anonymous(factory.post("/", HTTP_X_API_KEY="k")))


def test_an_anonymous_session_is_scoped_by_a_keyed_hash_of_its_cookie() -> None:
    def scope(cookie: str) -> str:
        request = factory.post("/")
        request.COOKIES["sessionid"] = cookie
        return default_scope(anonymous(request))

    one, other = scope("s1"), scope("s2")
    assert one.startswith("anonymous:") and other.startswith("anonymous:")
    assert one != other and one == scope("s1")
    assert "s1" not in one and len(one) <= 255
    with override_settings(SECRET_KEY="another-secret"):
        assert scope("s1") != one


@override_settings(IDEMPOTENCY={"CREDENTIAL_COOKIES": []})
def test_the_credential_cookies_are_a_setting() -> None:
    request = factory.post("/")
    request.COOKIES["sessionid"] = "s1"
    assert default_scope(anonymous(request)) == "anonymous"


def test_an_authenticated_user_is_the_scope_whatever_the_request_carries() -> None:
    user = UserFactory()
    request = factory.post("/", HTTP_AUTHORIZATION="Token abc")
    request.user = user
    assert default_scope(request) == f"user:{user.pk}"


# -- through the entry points -------------------------------------------------------------


def test_a_function_view_reached_with_unauthenticated_credentials_does_not_run() -> None:
    client = Client(headers={"authorization": "Bearer alice-token"})
    assert_problem(post_json(client, "k", {}, "/t/fn/"), 400, "credentials-not-authenticated")
    assert not SideEffect.objects.exists() and not IdempotencyKey.objects.exists()


def test_two_anonymous_sessions_do_not_share_a_key() -> None:
    from django.contrib.sessions.backends.db import SessionStore

    first, second = Client(), Client()
    for client in (first, second):
        session = SessionStore()
        session["cart"] = [1]  # an anonymous visitor's session: kept by SessionMiddleware
        session.save()
        client.cookies["sessionid"] = session.session_key or ""
    a = post_json(first, "cart", {}, "/t/fn/")
    b = post_json(second, "cart", {}, "/t/fn/")
    assert not replayed(a) and not replayed(b)
    assert replayed(post_json(first, "cart", {}, "/t/fn/"))
    assert SideEffect.objects.count() == 2


def test_a_drf_view_authenticates_before_the_claim() -> None:
    alice, bob = UserFactory(), UserFactory()
    post_json(token_client(alice), "same", {})
    response = post_json(token_client(bob), "same", {})
    assert not replayed(response)
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"user:{alice.pk}",
        f"user:{bob.pk}",
    }


# -- where IdempotencyMixin sits ----------------------------------------------------------


def test_the_mixin_after_apiview_is_refused_when_the_class_is_created() -> None:
    with pytest.raises(MisplacedIdempotencyMixin, match="must come before APIView"):

        class Wrong(APIView, IdempotencyMixin):
            pass

    with pytest.raises(MisplacedIdempotencyMixin):

        class AlsoWrong(generics.CreateAPIView, IdempotencyMixin):
            pass


def test_the_mixin_before_apiview_and_on_a_mixin_of_ones_own_is_accepted() -> None:
    class Right(IdempotencyMixin, APIView):
        pass

    class ProjectMixin(IdempotencyMixin):
        idempotency_required = True

    class ViaProjectMixin(ProjectMixin, generics.CreateAPIView):
        pass

    class Sub(Right):
        pass

    assert issubclass(Sub, IdempotencyMixin) and issubclass(ViaProjectMixin, ProjectMixin)


def test_the_mixin_on_a_plain_django_view_is_refused() -> None:
    with pytest.raises(MisplacedIdempotencyMixin, match="DRF views"):

        class Plain(IdempotencyMixin, View):
            pass


def test_the_misplaced_mixin_error_is_improperly_configured() -> None:
    from django.core.exceptions import ImproperlyConfigured

    assert issubclass(MisplacedIdempotencyMixin, ImproperlyConfigured)


# -- the error format ---------------------------------------------------------------------


def test_the_problem_base_uri_is_a_setting() -> None:
    assert InvalidKey().type_uri == PROBLEM_BASE + "invalid-key"
    with override_settings(IDEMPOTENCY={"PROBLEM_BASE_URI": "https://api.example.com/errors/"}):
        assert InvalidKey().type_uri == "https://api.example.com/errors/invalid-key"
        payload = assert_problem(post_json(Client(), "", {}, "/t/fn/"), 400, "invalid-key")
        assert payload["type"] == "https://api.example.com/errors/invalid-key"


seen: list[tuple[IdempotencyError, Any]] = []


def render_error(error: IdempotencyError, request: Any) -> HttpResponse:
    """A project's own error format."""
    seen.append((error, request))
    response = JsonResponse(
        {"error": {"code": error.slug, "message": error.detail}}, status=error.status
    )
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    return response


@override_settings(IDEMPOTENCY={"PROBLEM_RENDERER": f"{__name__}.render_error"})
def test_a_problem_renderer_renders_the_errors_of_both_entry_points() -> None:
    seen.clear()
    alice = UserFactory()
    client = token_client(alice)
    post_json(client, "k", {"a": 1})
    response = post_json(client, "k", {"a": 2})
    assert response.status_code == 422 and response["Content-Type"] == "application/json"
    assert json.loads(response.content)["error"]["code"] == "key-reused"
    assert seen[-1][1] is not None and seen[-1][1].user == alice  # DRF's request
    response = post_json(Client(), "", {}, "/t/fn/")
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["code"] == "invalid-key"
