"""A body shorter than its ``Content-Length`` (a client that hung up half-way, which gunicorn
hands over without an error; tests/system/test_truncated_body.py sends one to a real
gunicorn and uvicorn) is refused before the key is claimed: ``400 incomplete-body``, nothing
stored, the view not run, so that the complete retry runs it, once. On every entry point,
through Django's test clients (the ASGI handler for the ASGI entries) with a short stream
under a longer announced length; JSON, urlencoded and multipart bodies.
"""

from __future__ import annotations

import json
import uuid
from io import BytesIO
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client, RequestFactory
from django.test.client import BOUNDARY, MULTIPART_CONTENT, FakePayload, encode_multipart

from django_idempotency.errors import IncompleteBody
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.body import announced_length, parse_form, read_body

from ..support.assertions import assert_problem
from .test_keysource import ASGI, DRF, ENTRIES, charge, entry_point, replayed, runs, url

pytestmark = [pytest.mark.urls("tests.support.bodykey"), pytest.mark.django_db]

NOTE = "n" * 4000
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


def _bodies() -> dict[str, tuple[str, bytes]]:
    fields = {**charge(), "note": NOTE}
    return {
        "json": (JSON, json.dumps(fields).encode()),
        "form": (FORM, urlencode(fields).encode()),
        "multipart": (MULTIPART_CONTENT, encode_multipart(BOUNDARY, fields)),
    }


def send_part(entry: str, key: str | None, content_type: str, body: bytes, sent: int) -> Any:
    """POST announcing ``len(body)`` bytes but handing over only the first ``sent``, as a
    server does when its client hung up; through the ASGI handler for the entries in
    ``ASGI``."""
    part = body[:sent]
    if entry in ASGI:
        headers = [
            (b"host", b"testserver"),
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *([(b"idempotency-key", key.encode())] if key is not None else []),
        ]
        return async_to_sync(AsyncClient().request)(
            method="POST", path=url(entry), headers=headers, _body_file=FakePayload(part)
        )
    return Client().generic(
        "POST",
        url(entry),
        headers={} if key is None else {"Idempotency-Key": key},
        **_wsgi(content_type, len(body), part),
    )


def _wsgi(content_type: str, announced: int | str, part: bytes) -> dict[str, Any]:
    """The environ of a body of which the server handed over ``part`` of ``announced``."""
    return {
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(announced),
        "wsgi.input": BytesIO(part),
    }


def send_whole(entry: str, key: str, content_type: str, body: bytes) -> Any:
    return send_part(entry, key, content_type, body, len(body))


#: Multipart on the DRF entries: the plain views of bodykey read ``request.body``, which Django
#: refuses once it has parsed a multipart POST.
CASES = [(entry, kind) for entry in ENTRIES for kind in ("json", "form")] + [
    (entry, "multipart") for entry in DRF
]


@pytest.mark.parametrize(("entry", "kind"), CASES)
def test_half_a_body_is_refused_and_the_whole_retry_runs_once(entry: str, kind: str) -> None:
    key = str(uuid.uuid4())
    content_type, body = _bodies()[kind]
    with entry_point(entry):
        half = send_part(entry, key, content_type, body, len(body) // 2)
        payload = assert_problem(half, 400, "incomplete-body")
        assert f"{len(body) // 2} of the {len(body)} bytes" in payload["detail"]
        assert runs(entry) == 0
        assert not IdempotencyKey.objects.exists()
        whole = send_whole(entry, key, content_type, body)
        assert whole.status_code == 201 and not replayed(whole), whole.content
        again = send_whole(entry, key, content_type, body)
        assert again.status_code == 201 and replayed(again)
    assert runs(entry) == 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_body_one_byte_short_is_refused(entry: str) -> None:
    content_type, body = _bodies()["json"]
    with entry_point(entry):
        short = send_part(entry, "one-short", content_type, body, len(body) - 1)
        assert_problem(short, 400, "incomplete-body")
    assert runs(entry) == 0


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_short_body_without_a_key_is_the_views_to_answer(entry: str) -> None:
    """No key, none required: the app does not read the body, and the view answers what it
    got, as without the app."""
    content_type, body = _bodies()["json"]
    with entry_point(entry, KEY_BODY_FIELD=None):
        response = send_part(entry, None, content_type, body, len(body) // 2)
    assert response.status_code != 500
    assert not response.get("Content-Type", "").startswith("application/problem+json")
    assert not IdempotencyKey.objects.exists()


# -- the functions -----------------------------------------------------------------------------


def _request(body: bytes, announced: int | str, content_type: str = JSON) -> Any:
    return RequestFactory().generic("POST", "/", **_wsgi(content_type, announced, body))


@pytest.mark.parametrize(
    ("header", "expected"),
    [("12", 12), ("0", None), ("", None), ("-3", None), ("twelve", None), (" 7 ", 7)],
)
def test_the_announced_length(header: str, expected: int | None) -> None:
    assert announced_length(_request(b"", header)) == expected


def test_read_body_is_the_whole_body_when_it_all_came() -> None:
    assert read_body(_request(b"{}", 2)) == b"{}"


def test_read_body_refuses_a_short_one_with_both_lengths() -> None:
    with pytest.raises(IncompleteBody) as info:
        read_body(_request(b'{"a"', 10))
    assert info.value.status == 400 and info.value.slug == "incomplete-body"
    assert "4 of the 10 bytes" in str(info.value.detail)


def test_a_reader_that_stopped_early_is_not_a_short_body() -> None:
    """Something read part of the stream and stopped: the stream has more, so the body is
    not taken for a short one (the form it leaves is Django's to judge). One that read all
    there was, short of the announced length, found a short body."""
    body = urlencode({"a": "1", "b": NOTE}).encode()
    request = _request(body, len(body), FORM)
    request.read(10)
    parse_form(request)  # no IncompleteBody
    short = _request(body[:10], len(body), FORM)
    assert short.read() == body[:10]
    with pytest.raises(IncompleteBody):
        parse_form(short)


def test_a_multipart_body_cut_inside_a_file_is_refused() -> None:
    """Django's multipart parser keeps what it got of a file and reports nothing."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = encode_multipart(
        BOUNDARY, {"amount": "1", "file": SimpleUploadedFile("a.bin", b"x" * 5000)}
    )
    whole = _request(body, len(body), MULTIPART_CONTENT)
    parse_form(whole)
    assert whole.FILES["file"].size == 5000
    cut = _request(body[: len(body) - 40], len(body), MULTIPART_CONTENT)
    with pytest.raises(IncompleteBody):
        parse_form(cut)
