"""A replay is never a representation the retry did not accept, and keeps the language it
was produced in: every entry point, through Django's test client, on PostgreSQL and SQLite.

The views are in ``tests/support/negotiation.py``. A retry that does not accept the stored
media type (its ``Accept`` header, or DRF's ``?format=``) is a 406 ``replay-not-acceptable``
problem, and the view does not run again; a retry that does gets the stored bytes.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient, Client, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..support.assertions import assert_problem
from ..testapp.models import SideEffect

pytestmark = [
    pytest.mark.urls("tests.support.negotiation"),
    pytest.mark.django_db(databases=["default", "sqlite"]),
]

ALIASES = [
    pytest.param("default", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("sqlite", id="sqlite"),
]
DRF = ["drf-class", "drf-function", "drf-below"]
#: Plain views: ``@idempotent`` (sync, and async through ASGI) and the middleware (on the
#: WSGI handler, and on the ASGI one, where it runs its async path).
PLAIN = ["plain", "async", "middleware", "middleware-asgi"]
ENTRIES = DRF + PLAIN
PATHS = {entry: f"/neg/{entry}/" for entry in ENTRIES} | {"middleware-asgi": "/neg/middleware/"}
ASGI = {"async", "middleware-asgi"}
IDEMPOTENCY_MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"
LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"
HTML = "text/html; charset=utf-8"


@contextmanager
def entry_point(entry: str, alias: str = "default", **idempotency: Any) -> Iterator[None]:
    """The settings ``entry`` needs (the middleware in ``MIDDLEWARE``), the keys in ``alias``."""
    middleware = list(settings.MIDDLEWARE)
    if entry.startswith("middleware"):
        middleware.append(IDEMPOTENCY_MIDDLEWARE)
    with override_settings(MIDDLEWARE=middleware, IDEMPOTENCY=keys_in(alias, **idempotency)):
        yield


def keys_in(alias: str, **idempotency: Any) -> dict[str, Any]:
    """``IDEMPOTENCY`` with the keys in ``alias``. The test views write their SideEffect
    rows on ``default``: with the keys elsewhere, that split is declared (the rows only
    count executions here), as the write guard would refuse them otherwise."""
    unprotected = {"UNPROTECTED_DATABASES": ["default"]} if alias != "default" else {}
    return {"DATABASE": alias, **unprotected, **idempotency}


def send(
    client: Client,
    entry: str,
    key: str,
    *,
    accept: str | None = None,
    query: str = "",
    body: dict[str, Any] | None = None,
    language: str | None = None,
) -> Any:
    """POST ``body`` as JSON to ``entry``'s view, through the ASGI handler (Django's
    ``AsyncClient``) for the entries in ``ASGI``, else through the WSGI one (``client``)."""
    headers = {"Idempotency-Key": key}
    if accept is not None:
        headers["Accept"] = accept
    if language is not None:
        headers["Accept-Language"] = language
    post: Any = async_to_sync(AsyncClient().post) if entry in ASGI else client.post
    data = json.dumps(body or {})
    return post(PATHS[entry] + query, data, content_type="application/json", headers=headers)


def runs(entry: str) -> int:
    label = "neg-" + PATHS[entry].strip("/").split("/")[-1]
    return SideEffect.objects.filter(label=label).count()


def assert_replay_of(replay: Any, first: Any) -> None:
    """``replay`` is the stored ``first``: status, media type and the very bytes."""
    assert replay.status_code == first.status_code
    assert replay.headers.get(REPLAYED_HEADER) == "true"
    assert replay.headers.get("Content-Type") == first.headers.get("Content-Type")
    assert replay.content == first.content


def assert_not_acceptable(response: Any, first: Any) -> dict[str, Any]:
    """A 406 ``replay-not-acceptable`` problem naming ``first``'s status and media type."""
    payload = assert_problem(response, 406, "replay-not-acceptable")
    assert payload["original_status"] == first.status_code
    assert payload["original_content_type"] == first["Content-Type"]
    assert REPLAYED_HEADER not in response.headers
    assert first.content not in response.content
    return payload


def assert_not_acceptable_page(response: Any, first: Any) -> None:
    """The 406 ``replay-not-acceptable`` problem inside DRF's browsable API page."""
    assert response.status_code == 406
    assert response["Content-Type"] == HTML
    assert REPLAYED_HEADER not in response.headers
    page = html.unescape(re.sub(r"<[^>]+>", "", response.content.decode()))
    assert "/replay-not-acceptable" in page
    assert f'"original_status": {first.status_code}' in page
    assert f'"original_content_type": "{first["Content-Type"]}"' in page
    assert first.content.decode() not in page


# -- Accept ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_html_first_then_a_json_retry_is_406_never_the_html(entry: str, alias: str) -> None:
    client = Client()
    with entry_point(entry, alias):
        first = send(client, entry, "k", accept="text/html")
        assert first.status_code == 201
        assert first["Content-Type"] == HTML
        retry = send(client, entry, "k", accept="application/json")
        payload = assert_not_acceptable(retry, first)
        assert "text/html" in payload["detail"]
        assert "Location" not in retry.headers
        again = send(client, entry, "k", accept="text/html,application/xhtml+xml")
        assert_replay_of(again, first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_json_first_then_a_browser_retry_gets_the_json(entry: str) -> None:
    """``text/html,*/*;q=0.8`` accepts JSON: the replay is the stored JSON, although the
    view itself would render HTML for that header."""
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", accept="application/json")
        assert first.status_code == 201
        assert first["Content-Type"] == "application/json"
        retry = send(client, entry, "k", accept="text/html,*/*;q=0.8")
        assert_replay_of(retry, first)
        assert json.loads(retry.content)["charge"] == 1
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_a_retry_without_accept_gets_the_stored_representation(entry: str, accept: str) -> None:
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", accept=accept)
        assert_replay_of(send(client, entry, "k"), first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_key_reused_for_another_request_is_still_422(entry: str) -> None:
    """The 406 is for the same request only: a different body under the key is 422."""
    client = Client()
    with entry_point(entry):
        send(client, entry, "k", accept="text/html", body={"amount": 1})
        retry = send(client, entry, "k", accept="application/json", body={"amount": 2})
        assert_problem(retry, 422, "key-reused")
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", [*PLAIN, "drf-class"])
@pytest.mark.parametrize(
    ("accept", "replayed"),
    [
        ("application/*", True),
        ("application/json; charset=utf-8", True),
        ("application/json;q=0.1, text/html", True),
        ("*/*", True),
        ("text/html", False),
        ("application/json;q=0, */*", False),
        ("*/*;q=0", False),
        ("application/json;q=0", False),
        ("application/*;q=0, text/*", False),
    ],
)
def test_what_accepts_the_stored_json(entry: str, accept: str, replayed: bool) -> None:
    """A refused retry gets the 406 as problem+json, or inside the browsable API's page
    when it asked a mixin's view for HTML only (DRF picked that renderer for it)."""
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", accept="application/json")
        retry = send(client, entry, "k", accept=accept)
        if replayed:
            assert_replay_of(retry, first)
        elif entry == "drf-class" and accept == "text/html":
            assert_not_acceptable_page(retry, first)
        else:
            assert_not_acceptable(retry, first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", PLAIN)
@pytest.mark.parametrize(
    ("shape", "accept", "replayed"),
    [
        ("empty", "application/json", True),  # a 204 has no representation to refuse
        ("empty-typed", "application/json", True),  # nor with Django's text/html on it
        ("problem", "application/json", True),  # +json is JSON
        ("problem", "application/problem+json", True),
        ("problem", "text/html", False),
        ("vnd", "application/json", True),
        ("vnd", "application/vnd.api+json", True),
        ("vnd", "application/vnd.other+json", False),
        ("application/json", "application/vnd.api+json", False),  # JSON is not JSON:API
        ("text/csv; charset=utf-8", "text/csv; charset=UTF-8", True),
        ("text/csv; charset=latin-1", "text/csv; charset=utf-8", False),
        ("text/csv", "text/csv; header=present", False),
    ],
)
def test_stored_media_types(entry: str, shape: str, accept: str, replayed: bool) -> None:
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", body={"as": shape})
        retry = send(client, entry, "k", body={"as": shape}, accept=accept)
        if replayed:
            assert_replay_of(retry, first)
        else:
            assert_not_acceptable(retry, first)
    assert runs(entry) == 1
    if shape == "empty":
        assert first.status_code == 204 and "Content-Type" not in first.headers
    if shape == "problem":
        assert first["Content-Type"] == PROBLEM_CONTENT_TYPE and first.status_code == 409


@pytest.mark.parametrize("entry", ["plain", "middleware"])
def test_an_accept_without_a_media_range_accepts_anything(entry: str) -> None:
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", accept="text/html")
        for accept in ("", "garbage", "text", "*/json", "text/html;q=2", ",;,"):
            assert_replay_of(send(client, entry, "k", accept=accept), first)
    assert runs(entry) == 1


def test_only_the_first_64_media_ranges_are_read() -> None:
    """A huge ``Accept`` costs bounded work; a range past the 64th does not count."""
    client = Client()
    with entry_point("plain"):
        first = send(client, "plain", "k", accept="application/json")
        many = ", ".join(["text/plain"] * 64)
        assert_not_acceptable(send(client, "plain", "k", accept=many + ", */*"), first)
        huge = ", ".join(["text/plain;q=0.5"] * 2000) + ", application/json"
        assert_not_acceptable(send(client, "plain", "k", accept=huge), first)
        assert_replay_of(send(client, "plain", "k", accept="*/*, " + many), first)
    assert runs("plain") == 1


@pytest.mark.redis
@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("entry", ["drf-class", "plain"])
def test_on_the_redis_strategy(entry: str, redis_settings: Any, shared_redis_url: str) -> None:
    """The redis strategy replays from Redis: the same check, the same stored language."""
    value = redis_settings(shared_redis_url)
    value.pop("DATABASE", None)
    client = Client()
    with with_locale(entry, **value):
        first = send(client, entry, "k", accept="text/html", language="de")
        assert first.status_code == 201 and first["Content-Language"] == "de"
        assert_not_acceptable(send(client, entry, "k", accept="application/json"), first)
        again = send(client, entry, "k", accept="text/html", language="fr")
        assert_replay_of(again, first)
        assert again["Content-Language"] == "de"
    assert runs(entry) == 1


# -- DRF's ?format= --------------------------------------------------------------------------


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("entry", DRF)
def test_format_api_first_then_format_json_is_406_not_422(entry: str, alias: str) -> None:
    client = Client()
    with entry_point(entry, alias):
        first = send(client, entry, "k", query="?format=api")
        assert first.status_code == 201 and first["Content-Type"] == HTML
        assert_not_acceptable(send(client, entry, "k", query="?format=json"), first)
        assert_not_acceptable(send(client, entry, "k", accept="application/json"), first)
        assert_replay_of(send(client, entry, "k", query="?format=api"), first)
        assert_replay_of(send(client, entry, "k", accept="text/html"), first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", DRF)
def test_format_json_first_then_format_api_is_406(entry: str) -> None:
    """The 406 is a problem, not the replay: the browsable API (``?format=api``) is shown it
    in its page on the mixin's views (``drf-class``, ``drf-function``), and the stored JSON
    is not rendered again; ``@idempotent`` below ``@api_view`` answers problem+json."""
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", query="?format=json")
        assert first.status_code == 201 and first["Content-Type"] == "application/json"
        refused = send(client, entry, "k", query="?format=api")
        if entry == "drf-below":
            assert_not_acceptable(refused, first)
        else:
            assert_not_acceptable_page(refused, first)
        assert_replay_of(send(client, entry, "k", query="?format=json"), first)
        assert_replay_of(send(client, entry, "k", accept="application/json"), first)
        assert_replay_of(send(client, entry, "k"), first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", DRF)
def test_json_by_accept_first_then_format_json_is_the_replay(entry: str) -> None:
    client = Client()
    with entry_point(entry):
        first = send(client, entry, "k", accept="application/json")
        assert_replay_of(send(client, entry, "k", query="?format=json"), first)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", DRF)
def test_other_query_parameters_still_count(entry: str) -> None:
    client = Client()
    with entry_point(entry):
        send(client, entry, "k", query="?format=json&account=1")
        assert_problem(send(client, entry, "k", query="?format=json&account=2"), 422, "key-reused")
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", PLAIN)
def test_format_on_a_plain_view_is_part_of_the_request(entry: str) -> None:
    """Outside DRF ``?format=`` is the view's own parameter: a different one is 422."""
    client = Client()
    with entry_point(entry):
        send(client, entry, "k", query="?format=pdf")
        assert_problem(send(client, entry, "k", query="?format=csv"), 422, "key-reused")
    assert runs(entry) == 1


# -- Content-Language ------------------------------------------------------------------------


@contextmanager
def with_locale(entry: str, alias: str = "default", **idempotency: Any) -> Iterator[None]:
    """``entry_point`` with ``LocaleMiddleware`` after the session middleware, as Django
    documents it, and English, German and French."""
    middleware = list(settings.MIDDLEWARE)
    common = middleware.index("django.middleware.common.CommonMiddleware")
    middleware.insert(common, LOCALE_MIDDLEWARE)
    if entry.startswith("middleware"):
        middleware.append(IDEMPOTENCY_MIDDLEWARE)
    languages = [("en", "English"), ("de", "German"), ("fr", "French")]
    with override_settings(
        MIDDLEWARE=middleware,
        USE_I18N=True,
        LANGUAGE_CODE="en",
        LANGUAGES=languages,
        IDEMPOTENCY=keys_in(alias, **idempotency),
    ):
        yield


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_replay_keeps_the_language_it_was_produced_in(entry: str, alias: str) -> None:
    client = Client()
    with with_locale(entry, alias):
        first = send(client, entry, "k", accept="application/json", language="de")
        assert first["Content-Language"] == "de"
        assert json.loads(first.content)["language"] == "de"
        retry = send(client, entry, "k", accept="application/json", language="fr")
        assert_replay_of(retry, first)
        assert retry["Content-Language"] == "de"
        assert json.loads(retry.content)["language"] == "de"
        assert "accept-language" in retry["Vary"].lower()
        record = IdempotencyKey.objects.using(alias).get()
        assert record.response_headers["Content-Language"] == "de"
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", ["drf-class", "plain"])
def test_a_stored_vary_names_accept_language(entry: str) -> None:
    """With ``Vary`` in ``STORED_HEADERS`` the stored one names what LocaleMiddleware adds."""
    stored = ("Content-Type", "Content-Language", "Vary")
    client = Client()
    with with_locale(entry, STORED_HEADERS=stored):
        first = send(client, entry, "k", accept="application/json", language="de")
        record = IdempotencyKey.objects.get()
        vary = [v.strip().lower() for v in record.response_headers["Vary"].split(",")]
        assert "accept-language" in vary
        assert vary.count("accept-language") == 1
        # Middleware outside LocaleMiddleware (sessions: Cookie) add theirs to a replay too.
        assert set(vary) <= {v.strip().lower() for v in first["Vary"].split(",")}
        retry = send(client, entry, "k", accept="application/json", language="fr")
        assert retry["Content-Language"] == "de"


@pytest.mark.parametrize("entry", ["plain", "middleware"])
def test_a_content_language_of_the_view_is_kept(entry: str) -> None:
    """LocaleMiddleware only sets a missing Content-Language; what the view set is stored."""
    client = Client()
    body = {"content_language": "en-GB"}
    with with_locale(entry):
        first = send(client, entry, "k", body=body, accept="application/json", language="de")
        assert first["Content-Language"] == "en-GB"
        retry = send(client, entry, "k", body=body, accept="application/json", language="fr")
        assert_replay_of(retry, first)
        assert retry["Content-Language"] == "en-GB"
        assert IdempotencyKey.objects.get().response_headers["Content-Language"] == "en-GB"


def test_without_locale_middleware_no_language_is_stored() -> None:
    client = Client()
    with entry_point("plain"):
        send(client, "plain", "k", accept="application/json", language="de")
        assert "Content-Language" not in IdempotencyKey.objects.get().response_headers


# -- property: a replay's media type is always one the retry accepts ---------------------------

#: Stored media types: (the view's "as", type, subtype, structured suffix).
STORED = [
    ("application/json", "application", "json"),
    ("text/html; charset=utf-8", "text", "html"),
    ("application/problem+json", "application", "problem+json"),
    ("application/vnd.api+json", "application", "vnd.api+json"),
]


def _ranges_for(kind: str, subtype: str) -> list[tuple[str, int | None]]:
    """Media ranges and how specifically each matches ``kind/subtype`` (None: it does not)."""
    ranges: list[tuple[str, int | None]] = [
        ("*/*", 0),
        (f"{kind}/*", 1),
        (f"{kind}/{subtype}", 3),
        (f"{kind}/{subtype};version=2", None),
        ("image/png", None),
        ("text/plain", None),
        ("application/xml", None),
        ("application/vnd.other+json", None),
    ]
    if "+" in subtype:
        ranges.append((f"{kind}/{subtype.rsplit('+', 1)[1]}", 2))
    if kind != "text":
        ranges.append(("text/*", None))
    if kind != "application":
        ranges.append(("application/*", None))
    return ranges


@st.composite
def retry_accept(draw: st.DrawFn) -> tuple[str, str, bool]:
    """A stored media type, a generated ``Accept`` header, and whether it accepts it (the
    q of the most specific matching range, the highest of equally specific ones, is > 0)."""
    shape, kind, subtype = draw(st.sampled_from(STORED))
    candidates = _ranges_for(kind, subtype)
    chosen = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=6))
    elements, best, q_best = [], -1, 0.0
    for text, level in chosen:
        q = draw(st.sampled_from([None, "0", "0.0", "0.001", "0.5", "1", "1.000"]))
        space = draw(st.sampled_from(["", " "]))
        elements.append(text if q is None else f"{text};{space}q={q}")
        weight = 1.0 if q is None else float(q)
        if level is not None and level > best:
            best, q_best = level, weight
        elif level is not None and level == best:
            q_best = max(q_best, weight)
    separator = draw(st.sampled_from([",", ", ", " ,  "]))
    return shape, separator.join(elements), q_best > 0


@pytest.mark.parametrize("entry", PLAIN)
@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=retry_accept())
def test_a_replay_is_always_a_media_type_the_retry_accepts(
    entry: str, case: tuple[str, str, bool]
) -> None:
    shape, accept, accepted = case
    client = Client()
    key = uuid.uuid4().hex
    with entry_point(entry):
        first = send(client, entry, key, body={"as": shape})
        retry = send(client, entry, key, body={"as": shape}, accept=accept)
    if accepted:
        assert_replay_of(retry, first)
    else:
        assert_not_acceptable(retry, first)
