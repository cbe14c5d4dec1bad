"""The key in the JSON body (``KEY_BODY_FIELD``) and a view's own key hook
(``get_idempotency_key``, ``key=``), on every entry point: the DRF mixin,
``@idempotent_api_view``, ``@idempotent`` below ``@api_view``, sync and async ``@idempotent``,
and the middleware on WSGI and on ASGI; through Django's test client (``AsyncClient`` for
the ASGI ones) against the real views of ``tests/support/bodykey.py``, on the keys' default
database (PostgreSQL when it answers) with the ``db`` strategy.

The body's key follows the header's rules and gets its problem answers; its field is left
out of the fingerprint, the rest of the body is not; a header and a body that carry
different keys are refused; a body that is not JSON is not a key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient, Client, override_settings

from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.fingerprint import canonical_body
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..support import bodykey
from ..support.assertions import assert_problem
from ..support.threads import run_at_once
from ..testapp.models import SideEffect

pytestmark = [pytest.mark.urls("tests.support.bodykey"), pytest.mark.django_db]

FIELD = "idempotency_key"
DRF = ["drf-class", "drf-function", "drf-below"]
PLAIN = ["plain", "async", "middleware", "middleware-asgi"]
ENTRIES = DRF + PLAIN
ASGI = {"async", "middleware-asgi"}
IDEMPOTENCY_MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"


def url(entry: str, hook: bool = False) -> str:
    return f"/{'bk-hook' if hook else 'bk'}/{entry.removesuffix('-asgi')}/"


def runs(entry: str, hook: bool = False) -> int:
    label = ("bk-hook-" if hook else "bk-") + entry.removesuffix("-asgi")
    return SideEffect.objects.filter(label=label).count()


@contextmanager
def entry_point(entry: str, **idempotency: Any) -> Iterator[None]:
    """``KEY_BODY_FIELD = "idempotency_key"`` (and ``idempotency``), with the middleware in
    ``MIDDLEWARE`` for its entries."""
    middleware = list(settings.MIDDLEWARE)
    if entry.startswith("middleware"):
        middleware.append(IDEMPOTENCY_MIDDLEWARE)
    values = {"KEY_BODY_FIELD": FIELD, **idempotency}
    with override_settings(MIDDLEWARE=middleware, IDEMPOTENCY=values):
        yield


def send(
    entry: str,
    body: Any,
    *,
    header: str | None = None,
    hook: bool = False,
    raw: bytes | None = None,
    content_type: str = "application/json",
    language: str | None = None,
) -> Any:
    """POST ``body`` as JSON (or the bytes ``raw``) to ``entry``'s view, through the ASGI
    handler for the entries in ``ASGI``; ``header`` is sent as ``Idempotency-Key``."""
    headers: dict[str, str] = {}
    if header is not None:
        headers["Idempotency-Key"] = header
    if language is not None:
        headers["Accept-Language"] = language
    data = raw if raw is not None else json.dumps(body)
    post: Any = async_to_sync(AsyncClient().post) if entry in ASGI else Client().post
    return post(url(entry, hook), data, content_type=content_type, headers=headers)


def replayed(response: Any) -> bool:
    return response.headers.get(REPLAYED_HEADER) == "true"


NO_KEY = object()


def charge(key: Any = NO_KEY, amount: int = 100, **more: Any) -> dict[str, Any]:
    """A charge's JSON body, with ``key`` (any JSON value, null too) in the key's field."""
    body: dict[str, Any] = {"amount": amount, "currency": "eur", **more}
    if key is not NO_KEY:
        body[FIELD] = key
    return body


# -- the key in the body -----------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_body_key_is_claimed_and_a_retry_replays(entry: str) -> None:
    key = str(uuid.uuid4())
    with entry_point(entry):
        first = send(entry, charge(key))
        assert first.status_code == 201, first.content
        assert json.loads(first.content)["key"] == key
        retry = send(entry, charge(key))
        assert retry.status_code == 201 and replayed(retry)
        assert retry.content == first.content
    assert runs(entry) == 1
    assert IdempotencyKey.objects.get().key == key


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_key_field_is_left_out_of_the_fingerprint(entry: str) -> None:
    """A retry that moves the key from the header into the body (or the body's members
    about) changes nothing else: it is the replay, not a 422."""
    with entry_point(entry):
        first = send(entry, charge(), header="moved")
        assert first.status_code == 201
        retry = send(entry, {FIELD: "moved", "currency": "eur", "amount": 100})
        assert retry.status_code == 201 and replayed(retry)
        both = send(entry, charge("moved"), header='"moved"')
        assert both.status_code == 201 and replayed(both)
        # another key in the field, nothing else changed: another operation, not a 422
        other = send(entry, charge("another"))
        assert other.status_code == 201 and not replayed(other)
    assert runs(entry) == 2


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_rest_of_the_body_is_fingerprinted(entry: str) -> None:
    with entry_point(entry):
        assert send(entry, charge("same", amount=100)).status_code == 201
        other = send(entry, charge("same", amount=999))
        assert_problem(other, 422, "key-reused")
        nested = send(entry, charge("same", amount=100, meta={FIELD: "x"}))
        assert_problem(nested, 422, "key-reused")  # only the top-level field is the key's
    assert runs(entry) == 1


BAD_VALUES = [
    pytest.param(12345, "must be a string", id="number"),
    pytest.param(None, "must be a string", id="null"),
    pytest.param(True, "must be a string", id="boolean"),
    pytest.param(["k"], "must be a string", id="list"),
    pytest.param({"k": 1}, "must be a string", id="object"),
    pytest.param("", "is empty", id="empty"),
    pytest.param("k" * 256, "longer than 255 characters", id="too-long"),
    pytest.param("a\nb", "visible ASCII", id="control"),
    pytest.param("a b", "visible ASCII", id="space"),
    pytest.param("schlüssel", "visible ASCII", id="non-ascii"),
    pytest.param("\ud800", "visible ASCII", id="lone-surrogate"),
]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("value", "reason"), BAD_VALUES)
def test_a_bad_body_key_is_400_invalid_key(entry: str, value: Any, reason: str) -> None:
    with entry_point(entry):
        response = send(entry, charge(value))
        payload = assert_problem(response, 400, "invalid-key")
        assert reason in payload["detail"]
        assert f'"{FIELD}"' in payload["detail"]
        # with a good header too: the field is the key's, and a bad one is never ignored
        assert_problem(send(entry, charge(value), header="good"), 400, "invalid-key")
    assert runs(entry) == 0
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_longest_key_is_taken(entry: str) -> None:
    key = "~" * 255
    with entry_point(entry):
        assert send(entry, charge(key)).status_code == 201
    assert IdempotencyKey.objects.get().key == key


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_header_and_a_body_with_different_keys_are_400(entry: str) -> None:
    with entry_point(entry):
        response = send(entry, charge("in-body"), header="in-header")
        payload = assert_problem(response, 400, "invalid-key")
        assert "Idempotency-Key" in payload["detail"] and FIELD in payload["detail"]
        same = send(entry, charge("both"), header="both")
        assert same.status_code == 201
    assert runs(entry) == 1
    assert IdempotencyKey.objects.get().key == "both"


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_repeated_key_field_is_400(entry: str) -> None:
    """``{"idempotency_key": "a", "idempotency_key": "b"}``: which one was meant cannot be
    told (a JSON parser keeps the last one, another the first)."""
    raw = b'{"amount": 1, "idempotency_key": "a", "idempotency_key": "b"}'
    with entry_point(entry):
        payload = assert_problem(send(entry, None, raw=raw), 400, "invalid-key")
        assert "more than once" in payload["detail"]
    assert runs(entry) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_body_that_is_not_json_is_400_invalid_body_without_a_header(entry: str) -> None:
    raw = b'{"idempotency_key": "k", "amount": '
    with entry_point(entry):
        payload = assert_problem(send(entry, None, raw=raw), 400, "invalid-body")
        assert FIELD in payload["detail"]
        # With the key in the header, the body is fingerprinted as it is: the view answers.
        answered = send(entry, None, raw=raw, header="h")
        assert answered.status_code != 500
        assert IdempotencyKey.objects.get().key == "h"


@pytest.mark.parametrize("entry", ENTRIES)
def test_json_that_is_not_an_object_carries_no_key(entry: str) -> None:
    with entry_point(entry):
        assert send(entry, ["idempotency_key", "k"]).status_code == 201
        assert send(entry, "idempotency_key").status_code == 201
        assert send(entry, None, raw=b"").status_code == 201
    assert not IdempotencyKey.objects.exists()


MULTIPART = (
    b'--B\r\nContent-Disposition: form-data; name="idempotency_key"\r\n\r\nform-key\r\n--B--\r\n'
)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        pytest.param(
            f"{FIELD}=form-key&amount=1".encode(), "application/x-www-form-urlencoded", id="form"
        ),
        pytest.param(MULTIPART, "multipart/form-data; boundary=B", id="multipart"),
        pytest.param(b'{"idempotency_key": "k"}', "text/plain", id="json-as-text"),
    ],
)
def test_a_body_that_is_not_json_carries_no_key(entry: str, raw: bytes, content_type: str) -> None:
    """Only a JSON body's field is read: a form's field of that name is the view's data
    (the view answers, as without the setting: DRF's 415 for a media type it does not
    parse)."""
    with entry_point(entry):
        response = send(entry, None, raw=raw, content_type=content_type)
        assert response["Content-Type"] != "application/problem+json"
        assert response.status_code == (415 if entry in DRF and "text" in content_type else 201)
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("entry", ENTRIES)
def test_missing_key_says_where_the_key_is_expected(entry: str) -> None:
    with entry_point(entry, REQUIRED=True):
        payload = assert_problem(send(entry, charge()), 400, "missing-key")
        assert "Idempotency-Key header" in payload["detail"]
        assert f'"{FIELD}" field in a JSON body' in payload["detail"]
        form = send(entry, None, raw=b"a=1", content_type="application/x-www-form-urlencoded")
        assert_problem(form, 400, "missing-key")
    assert runs(entry) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_body_too_large_to_read_is_413(entry: str) -> None:
    with entry_point(entry), override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100):
        response = send(entry, charge("big", note="x" * 200))
        assert_problem(response, 413, "request-too-large")
    assert runs(entry) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_reads_the_body_before_it_judges_the_header(entry: str) -> None:
    """With ``KEY_BODY_FIELD`` set the body is read first, once, on every entry point: a body
    too large to read is a 413 whatever the header says, a readable one with a bad header
    is the header's 400."""
    with entry_point(entry), override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100):
        too_large = send(entry, charge(note="x" * 200), header="bad key")
        assert_problem(too_large, 413, "request-too-large")
        assert_problem(send(entry, charge(), header="bad key"), 400, "invalid-key")
    assert runs(entry) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_without_the_setting_the_field_is_the_views_data(entry: str) -> None:
    with entry_point(entry, KEY_BODY_FIELD=None):
        first = send(entry, charge("not-a-key"))
        assert first.status_code == 201 and json.loads(first.content)["key"] is None
        assert send(entry, charge("not-a-key")).status_code == 201
    assert runs(entry) == 2
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.django_db(transaction=True)
def test_a_race_of_two_requests_with_one_body_key_runs_the_view_once(entry: str) -> None:
    """Two threads send the same body key at once. Whichever claims it holds its view
    until the other has its answer, a 409 request-in-progress; then it completes, and a
    third request replays it."""
    bodykey.held.reset()
    body = charge("raced", hold=True)

    def racer(index: int) -> tuple[int, Any]:
        response = send(entry, body)
        if response.status_code == 409:
            bodykey.held.opened.set()  # the other one holds the key: let it finish
        return response.status_code, response

    with entry_point(entry):
        answers = run_at_once(2, racer)
        statuses = sorted(status for status, _ in answers)
        assert statuses == [201, 409], [r.content for _, r in answers]
        conflict = next(r for status, r in answers if status == 409)
        assert_problem(conflict, 409, "request-in-progress")
        again = send(entry, body)
        assert again.status_code == 201 and replayed(again)
    assert runs(entry) == 1


# -- a view's own key hook -----------------------------------------------------------------------


def hooked(key: Any = None, amount: int = 100) -> dict[str, Any]:
    body: dict[str, Any] = {"amount": amount}
    if key is not None:
        body["meta"] = {"request_id": key}
    return body


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_hook_finds_the_key_where_the_client_sends_it(entry: str) -> None:
    with entry_point(entry, KEY_BODY_FIELD=None):
        first = send(entry, hooked("from-meta"), hook=True)
        assert first.status_code == 201 and json.loads(first.content)["key"] == "from-meta"
        retry = send(entry, hooked("from-meta"), hook=True)
        assert replayed(retry) and retry.content == first.content
        # the hook parsed the body (DRF's request.data): the fingerprint still has it
        assert_problem(send(entry, hooked("from-meta", 5), hook=True), 422, "key-reused")
        # the header is not where this view looks
        assert send(entry, hooked(), hook=True, header="ignored").status_code == 201
    assert runs(entry, hook=True) == 2
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["from-meta"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(7, "must be a string", id="number"),
        pytest.param("", "is empty", id="empty"),
        pytest.param("x" * 300, "longer than 255", id="too-long"),
        pytest.param("a\tb", "visible ASCII", id="control"),
    ],
)
def test_what_a_hook_returns_is_checked_as_a_key(entry: str, value: Any, reason: str) -> None:
    with entry_point(entry):
        payload = assert_problem(send(entry, hooked(value), hook=True), 400, "invalid-key")
        assert reason in payload["detail"]
    assert runs(entry, hook=True) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_hook_view_that_requires_a_key(entry: str) -> None:
    with entry_point(entry, REQUIRED=True):
        payload = assert_problem(send(entry, hooked(), hook=True), 400, "missing-key")
        assert payload["detail"] == "This endpoint requires an idempotency key."
        # not a form either: the hook reads what it reads, and finds nothing
        form = send(
            entry, None, raw=b"a=1", content_type="application/x-www-form-urlencoded", hook=True
        )
        assert_problem(form, 400, "missing-key")
    assert runs(entry, hook=True) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_hook_that_cannot_parse_the_body_is_no_500(entry: str) -> None:
    """The hook parses a body that is not JSON: DRF's parse error is DRF's 400, a plain
    view's hook finds no key; nothing is claimed either way."""
    with entry_point(entry, KEY_BODY_FIELD=None):
        response = send(entry, None, raw=b'{"meta": ', hook=True)
    assert response.status_code == (400 if entry in DRF else 201), response.content
    assert not IdempotencyKey.objects.exists()


def test_a_key_hook_must_be_callable() -> None:
    for decorate in (
        lambda: idempotent(key="meta.request_id"),  # type: ignore[call-overload]
        lambda: idempotency_opt_in(key=42),  # type: ignore[call-overload]
        lambda: idempotent_api_view(["POST"], key="header"),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="key must be a callable"):
            decorate()


# -- the fingerprint ----------------------------------------------------------------------------


def test_canonical_body_leaves_out_only_the_top_level_field() -> None:
    a = canonical_body("application/json", b'{"b": 1, "idempotency_key": "x"}', FIELD)
    b = canonical_body("application/json", b'{ "b" : 1 }', FIELD)
    assert a == b == b'{"b":1}'
    nested = canonical_body("application/json", b'{"m": {"idempotency_key": "x"}}', FIELD)
    assert nested == b'{"m":{"idempotency_key":"x"}}'
    assert (
        canonical_body("application/json", b'["idempotency_key"]', FIELD) == b'["idempotency_key"]'
    )
