"""DRF's browsable API shows this app's problems inside its own page; API clients keep
``application/problem+json``; a configured ``PROBLEM_RENDERER`` wins; a replay is never
rendered again.

A browser that submits the browsable API's HTML form asks for ``text/html`` first (as
Chromium does for a page); the page's raw-data form (AJAX) sends ``text/html; q=1.0, */*``
and puts the answer in place of the page only when it is HTML (else it reloads the page,
and the answer is lost). Before, both got the raw problem JSON. Through Django's test client;
``tests/test_browsable_browser.py`` does the same in Chromium.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.db import OperationalError
from django.http import HttpRequest, JsonResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import include, path
from rest_framework import generics
from rest_framework.decorators import api_view
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency.decorators import idempotent
from django_idempotency.errors import IdempotencyError, MissingKey
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.fingerprint import fingerprint
from example_project.payments.models import Charge
from example_project.payments.serializers import ChargeSerializer

from .examples import drf_function_view, drf_viewset
from .support.api import replayed
from .support.assertions import assert_problem
from .support.factories import IdempotencyKeyFactory, UserFactory

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]

#: What Chromium asks for when it submits a form of a page.
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
#: What the browsable API's raw-data form (DRF's ajax-form.js) asks for.
AJAX = "text/html; q=1.0, */*"
HTML = "text/html; charset=utf-8"
VIEWSET = "/ex/viewset/charges/"
CHARGE = {"amount": "500", "currency": "EUR"}


class ConflictView(IdempotencyMixin, generics.GenericAPIView):
    """Its transaction always loses to a conflict: a 503 answered from ``dispatch()``."""

    serializer_class = ChargeSerializer

    def post(self, request: Request) -> Response:
        raise OperationalError("database is locked")


class BrokenPageView(IdempotencyMixin, generics.GenericAPIView):
    """Its browsable page cannot be built: the form's serializer needs a database that is
    gone (as a related field's choices would)."""

    serializer_class = ChargeSerializer
    idempotency_required = True

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    def post(self, request: Request) -> Response:
        return Response(status=201)  # pragma: no cover - a key is required and not sent


class HtmlFirstView(IdempotencyMixin, generics.GenericAPIView):
    """The browsable API is its first renderer: DRF picks it for ``Accept: */*``."""

    serializer_class = ChargeSerializer
    renderer_classes = [BrowsableAPIRenderer, JSONRenderer]
    idempotency_required = True

    def post(self, request: Request) -> Response:
        return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent(required=True)
def below_api_view(request: Request) -> Response:
    """``@idempotent`` below ``@api_view``: the decorator, not the mixin, answers."""
    return Response({"ok": True}, status=201)  # pragma: no cover - a key is required


def own_format(error: IdempotencyError, request: HttpRequest | None) -> JsonResponse:
    """A project's ``PROBLEM_RENDERER``."""
    return JsonResponse({"error": error.slug}, status=error.status)


urlpatterns = [
    path("ex/viewset/", include(drf_viewset.router.urls)),
    path("ex/drf-function/", drf_function_view.create_charge),
    path("conflict/", ConflictView.as_view()),
    path("broken-page/", BrokenPageView.as_view()),
    path("html-first/", HtmlFirstView.as_view()),
    path("below/", below_api_view),
]


@pytest.fixture
def alice() -> Any:
    return UserFactory(username="alice")


@pytest.fixture
def browser(alice: Any) -> Client:
    """Alice, logged in with a session cookie, as in the browsable API."""
    client = Client()
    client.force_login(alice)
    return client


def submit(client: Client, url: str, *, accept: str = BROWSER, key: str | None = None) -> Any:
    """The browsable API's HTML form: ``multipart/form-data``, as the browser posts it."""
    headers = {"Accept": accept} | ({"Idempotency-Key": key} if key else {})
    return client.post(url, CHARGE, headers=headers)


def send_json(
    client: Client, url: str, body: Any = None, *, accept: str | None = AJAX, key: str | None = None
) -> Any:
    """The raw-data form (``application/json``), or an API client with ``accept``."""
    headers = ({"Accept": accept} if accept else {}) | ({"Idempotency-Key": key} if key else {})
    data = json.dumps(CHARGE if body is None else body)
    return client.post(url, data, content_type="application/json", headers=headers)


def page_text(response: Any) -> str:
    """The text of a page: tags dropped (the page makes links of URIs), entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", response.content.decode()))


def assert_page(
    response: Any, error: type[IdempotencyError], *, default_detail: bool = True
) -> str:
    """``response`` is the browsable API's page (not raw JSON) with ``error``'s status,
    showing each member of its problem document (the default detail, unless the error
    says more); returns the page's text."""
    assert response.status_code == error.status, response.content[:300]
    assert response["Content-Type"] == HTML
    assert b'<div class="response-info"' in response.content  # DRF's browsable API page
    assert b'-generic-content-form"' in response.content  # with its forms
    page = page_text(response)
    assert f"HTTP {error.status} " in page
    # the response box names the problem's media type, not the view's first renderer's
    assert "Content-Type: application/problem+json" in page, page
    assert "Content-Type: application/json" not in page
    problem = error()
    members = [
        f'"type": "{problem.type_uri}"',
        f'"title": "{problem.title}"',
        f'"status": {error.status}',
        f'"detail": "{problem.detail}"' if default_detail else '"detail": "',
    ]
    for member in members:
        assert member in page, member
    return page


# -- the browsable API: the problem in its page ----------------------------------------------


@pytest.mark.parametrize("url", [VIEWSET, "/ex/drf-function/"], ids=["viewset", "api_view"])
def test_a_form_without_a_key_shows_the_problem_in_the_page(browser: Client, url: str) -> None:
    assert_page(submit(browser, url), MissingKey)
    assert not Charge.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_the_raw_data_form_gets_the_page_too(browser: Client) -> None:
    """DRF's AJAX form replaces the page only with HTML: a problem+json answer was lost."""
    response = send_json(browser, VIEWSET, accept=AJAX)
    assert_page(response, MissingKey)
    assert "Vary" in response and "Accept" in response["Vary"]


def test_a_patch_without_a_key_on_a_detail_page(browser: Client) -> None:
    """The detail page's forms (PUT, PATCH, DELETE) are built around the problem too."""
    created = send_json(browser, VIEWSET, accept="application/json", key="k-detail")
    detail = f"{VIEWSET}{created.json()['id']}/"
    response = browser.patch(
        detail, json.dumps({"amount": 9}), content_type="application/json", headers={"Accept": AJAX}
    )
    assert_page(response, MissingKey)
    assert b'id="put-object-form"' in response.content
    assert Charge.objects.get().amount == 500


def test_each_problem_of_the_request_path_is_shown(browser: Client, alice: Any) -> None:
    from django_idempotency.errors import FingerprintMismatch, InvalidKey, RequestInProgress

    page = assert_page(send_json(browser, VIEWSET, key='"open'), InvalidKey, default_detail=False)
    assert "sf-string" in page or "quote" in page
    assert send_json(browser, VIEWSET, key="k-1").status_code == 201
    assert_page(
        send_json(browser, VIEWSET, {"amount": 9, "currency": "EUR"}, key="k-1"),
        FingerprintMismatch,
    )
    # A key in progress (the same request, claimed by another worker): 409 with Retry-After,
    # in the page's headers and on the response.
    held = RequestFactory().post(VIEWSET, json.dumps(CHARGE), content_type="application/json")
    IdempotencyKeyFactory(scope=f"user:{alice.pk}", key="busy", fingerprint=fingerprint(held))
    response = send_json(browser, VIEWSET, key="busy")
    page = assert_page(response, RequestInProgress)
    assert response["Retry-After"] == "1"
    assert "Retry-After:" in page
    assert Charge.objects.count() == 1


def test_a_503_from_the_views_transaction_is_shown(browser: Client) -> None:
    from django_idempotency.errors import TransientConflict

    response = send_json(browser, "/conflict/", key="k-503")
    page = assert_page(response, TransientConflict, default_detail=False)
    assert response["Retry-After"] == "1"
    assert "transient-conflict" in page
    assert not IdempotencyKey.objects.exists()  # released
    # The API client's answer is unchanged.
    assert_problem(
        send_json(browser, "/conflict/", key="k-503", accept="application/json"),
        503,
        "transient-conflict",
    )


def test_format_api_asks_for_the_page(browser: Client) -> None:
    assert_page(send_json(browser, VIEWSET + "?format=api", accept=None), MissingKey)
    assert_problem(send_json(browser, VIEWSET + "?format=json", accept=BROWSER), 400, "missing-key")


# -- API clients keep application/problem+json -------------------------------------------------


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "*/*",
        "application/json",
        "application/problem+json, text/html;q=0.5",
        "text/html;q=0.5, application/json",
    ],
)
def test_api_clients_keep_problem_json(browser: Client, accept: str | None) -> None:
    assert_problem(send_json(browser, VIEWSET, accept=accept), 400, "missing-key")


def test_a_view_that_renders_html_first_still_answers_problem_json_to_any(
    browser: Client,
) -> None:
    """DRF picks the browsable API for ``*/*`` there; a client that did not ask for HTML
    (curl's ``*/*``, no Accept) is an API client all the same."""
    for accept in ("*/*", None):
        assert_problem(send_json(browser, "/html-first/", accept=accept), 400, "missing-key")
    assert_page(send_json(browser, "/html-first/", accept=BROWSER), MissingKey)


def test_a_configured_renderer_wins(browser: Client) -> None:
    with override_settings(IDEMPOTENCY={"PROBLEM_RENDERER": f"{__name__}.own_format"}):
        response = submit(browser, VIEWSET)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {"error": "missing-key"}


def test_a_page_that_cannot_be_built_falls_back_to_problem_json(
    browser: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Never a 500: rendering the page needs the view (its forms, their querysets); when
    that fails, the problem goes out as problem+json, and the failure is logged."""
    with caplog.at_level("WARNING", logger="django_idempotency"):
        response = submit(browser, "/broken-page/")
    assert_problem(response, 400, "missing-key")
    assert "could not render" in caplog.text


def test_idempotent_below_api_view_answers_problem_json(browser: Client) -> None:
    """Only the mixin (and ``@idempotent_api_view``, built on it) renders the page: under
    ``@idempotent`` the problem is answered before DRF's negotiation is consulted."""
    assert_problem(submit(browser, "/below/"), 400, "missing-key")


# -- a replay is never rendered again -----------------------------------------------------------


def test_a_json_answer_is_replayed_as_json_to_the_browser(browser: Client) -> None:
    first = send_json(browser, VIEWSET, accept="application/json", key="json-first")
    assert first.status_code == 201
    again = send_json(browser, VIEWSET, accept=AJAX, key="json-first")
    assert again.status_code == 201 and replayed(again)
    assert again["Content-Type"] == "application/json"
    assert again.content == first.content
    assert Charge.objects.count() == 1


def test_an_html_answer_is_replayed_byte_for_byte(browser: Client) -> None:
    first = send_json(browser, VIEWSET, accept=AJAX, key="html-first")
    assert first.status_code == 201 and first["Content-Type"] == HTML
    again = send_json(browser, VIEWSET, accept=AJAX, key="html-first")
    assert replayed(again) and again.content == first.content
    # An API client's retry does not accept the stored HTML: 406, as problem+json.
    refused = send_json(browser, VIEWSET, accept="application/json", key="html-first")
    assert_problem(refused, 406, "replay-not-acceptable")
    assert Charge.objects.count() == 1


def test_a_retry_that_accepts_only_html_gets_the_406_in_the_page(browser: Client) -> None:
    """The 406 is an answer, not the replay: it is rendered for the client that asked for
    HTML; the stored JSON is not, and the view does not run again."""
    from django_idempotency.errors import ReplayNotAcceptable

    assert (
        send_json(browser, VIEWSET, accept="application/json", key="only-html").status_code == 201
    )
    response = send_json(browser, VIEWSET, accept="text/html", key="only-html")
    page = page_text(response)
    assert response.status_code == 406 and response["Content-Type"] == HTML
    assert not replayed(response)
    assert ReplayNotAcceptable.slug in page and '"original_status": 201' in page
    assert Charge.objects.count() == 1
