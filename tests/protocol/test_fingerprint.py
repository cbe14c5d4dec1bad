"""Request fingerprints: canonical bodies, queries and forms, on every method."""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, RequestFactory, override_settings
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from django_idempotency.errors import InvalidBody, RequestTooLarge
from django_idempotency.protocol.body import preload as preload_body
from django_idempotency.protocol.fingerprint import canonical_body, fingerprint
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db

rf = RequestFactory()


# -- canonical bodies and fingerprints ------------------------------------------------------


def post(path: str, body: bytes | str, content_type: str = "application/json", **extra: Any):
    return rf.generic("POST", path, body, content_type=content_type, **extra)


def test_json_key_order_and_whitespace_do_not_matter() -> None:
    a = post("/pay/", '{"amount": 100, "currency": "EUR", "meta": {"b": 1, "a": [1, 2]}}')
    b = post("/pay/", '{"meta":{"a":[1,2],"b":1},"currency":"EUR","amount":100}')
    c = post("/pay/", '{\n  "currency" : "EUR",\n  "amount" : 100,\n "meta": {"a":[1, 2],"b":1}}\n')
    assert fingerprint(a) == fingerprint(b) == fingerprint(c)


def test_json_suffix_media_types_and_charset_are_canonicalised() -> None:
    a = post("/pay/", '{"a": 1, "b": 2}', "application/merge-patch+json")
    b = post("/pay/", '{"b":2,"a":1}', "application/merge-patch+json; charset=utf-8")
    assert fingerprint(a) == fingerprint(b)


def test_different_body_method_path_or_query_differ() -> None:
    base = fingerprint(post("/pay/?a=1", '{"amount": 100}'))
    assert fingerprint(post("/pay/?a=1", '{"amount": 101}')) != base
    assert fingerprint(post("/pay/?a=1", '{"amount": "100"}')) != base
    assert (
        fingerprint(rf.generic("PATCH", "/pay/?a=1", '{"amount": 100}', "application/json")) != base
    )
    assert fingerprint(post("/pay/other/?a=1", '{"amount": 100}')) != base
    assert fingerprint(post("/pay/?a=2", '{"amount": 100}')) != base
    assert fingerprint(post("/pay/", '{"amount": 100}')) != base
    assert fingerprint(post("/pay/?a=1", '{"amount": 100}')) == base


def test_query_order_does_not_matter_but_values_do() -> None:
    a = fingerprint(post("/pay/?a=1&b=2&c=", "{}"))
    assert fingerprint(post("/pay/?c=&b=2&a=1", "{}")) == a
    assert fingerprint(post("/pay/?a=1&b=3&c=", "{}")) != a
    assert fingerprint(post("/pay/?a=1&b=2", "{}")) != a


def test_repeated_query_names_keep_the_order_of_their_values() -> None:
    a = fingerprint(post("/pay/?a=1&a=100", "{}"))
    assert fingerprint(post("/pay/?a=100&a=1", "{}")) != a
    assert fingerprint(post("/pay/?a=1&a=100&a=1", "{}")) != a
    # other names may move around them
    assert fingerprint(post("/pay/?b=2&a=1&c=3&a=100", "{}")) == fingerprint(
        post("/pay/?a=1&c=3&a=100&b=2", "{}")
    )


def test_query_bytes_that_are_not_utf8_stay_apart() -> None:
    assert fingerprint(post("/pay/?a=%ff", "{}")) != fingerprint(post("/pay/?a=%fe", "{}"))


def test_form_fields_keep_the_order_of_repeated_names() -> None:
    form = "application/x-www-form-urlencoded"
    a = fingerprint(post("/pay/", "a=1&b=x&a=100", form))
    assert fingerprint(post("/pay/", "b=x&a=1&a=100", form)) == a
    assert fingerprint(post("/pay/", "a=100&b=x&a=1", form)) != a
    assert fingerprint(post("/pay/", "a=%ff", form)) != fingerprint(post("/pay/", "a=%fe", form))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ('{"amount": 19.99}', '{"amount": 19.990000000000000001}'),
        ('{"amount": 19.99}', '{"amount": 19.990}'),
        ('{"amount": 1e400}', '{"amount": 2e999}'),
        ('{"amount": 1}', '{"amount": 1.0}'),
        ('{"amount": 100}', '{"amount": 1e2}'),
        ('{"amount": 0}', '{"amount": -0}'),
        ('{"amount": 12345678901234567890123}', '{"amount": 12345678901234567890124}'),
        ('{"amount": 1}', '{"amount": "1"}'),
        ('{"a": 1, "a": 2}', '{"a": 2, "a": 1}'),
        ('{"a": 1, "a": 2}', '{"a": 2}'),
        ("[1, 2]", "[2, 1]"),
        ('{"a": null}', '{"a": false}'),
        ('{"a": true}', '{"a": "true"}'),
    ],
)
def test_json_numbers_keep_their_text_and_values_their_meaning(one: str, other: str) -> None:
    assert fingerprint(post("/pay/", one)) != fingerprint(post("/pay/", other))


def test_json_numbers_keep_their_text_through_reordering() -> None:
    a = post("/pay/", '{"amount": 19.990000000000000001, "big": 1e400, "n": [-0, 1E+2]}')
    b = post("/pay/", '{ "n" : [ -0 , 1E+2 ] , "big" : 1e400 , "amount" : 19.990000000000000001 }')
    assert fingerprint(a) == fingerprint(b)
    canonical = canonical_body("application/json", b'{"b": 1E+2, "a": [19.990, -0]}')
    assert canonical == b'{"a":[19.990,-0],"b":1E+2}'


def test_json_string_escapes_that_mean_the_same_text_are_equal() -> None:
    assert fingerprint(post("/pay/", '{"c": "\\u00e9/"}')) == fingerprint(
        post("/pay/", '{"c": "\u00e9\\/"}')
    )


def test_invalid_json_is_fingerprinted_as_bytes() -> None:
    assert canonical_body("application/json", b"{not json") == b"{not json"
    a = fingerprint(post("/pay/", "{not json"))
    assert fingerprint(post("/pay/", "{not json")) == a
    assert fingerprint(post("/pay/", "{not  json")) != a


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,  # deeper than the parser's recursion limit
        '{"a":' * 100_000,
        "[" * 900 + "]" * 900,  # valid, but deeper than is canonicalised
    ],
)
def test_bodies_that_cannot_be_canonicalised_are_fingerprinted_by_their_bytes(body: str) -> None:
    printed = fingerprint(post("/pay/", body))
    assert fingerprint(post("/pay/", body)) == printed
    assert fingerprint(post("/pay/", body + " ")) != printed
    assert canonical_body("application/json", body.encode()) == body.encode()


def test_lone_surrogates_are_canonicalised_like_other_strings() -> None:
    a = post("/pay/", '{"note": "\\ud800", "amount": 1}')
    b = post("/pay/", '{"amount":1,"note":"\\ud800"}')
    c = post("/pay/", '{"amount":1,"note":"\\udbff"}')
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)
    canonical = canonical_body("application/json", b'{"b": ["\\udfff", "\\ud800"], "a": 1}')
    assert canonical == b'{"a":1,"b":["\\udfff","\\ud800"]}'


def test_a_lone_surrogate_goes_through_a_view_and_replays() -> None:
    def send() -> Any:
        return Client().post(
            "/t/fn/",
            b'{"note": "\\ud800"}',
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY="surrogate",
        )

    first = send()
    assert first.status_code == 201, first.content
    assert send()[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 1


def test_other_media_types_are_taken_byte_for_byte() -> None:
    a = fingerprint(post("/pay/", "a b", "text/plain"))
    assert fingerprint(post("/pay/", "a  b", "text/plain")) != a
    assert fingerprint(post("/pay/", "a b", "text/plain")) == a


def test_form_bodies_ignore_field_order() -> None:
    form = "application/x-www-form-urlencoded"
    a = fingerprint(post("/pay/", "amount=100&currency=EUR&note=", form))
    assert fingerprint(post("/pay/", "currency=EUR&note=&amount=100", form)) == a
    assert fingerprint(post("/pay/", "currency=EUR&note=&amount=101", form)) != a
    assert fingerprint(post("/pay/", "currency=EUR&amount=100", form)) != a


def _multipart(data: dict[str, object], boundary: str = BOUNDARY, method: str = "POST"):
    body = encode_multipart(boundary, data)
    return rf.generic(
        method, "/upload/", body, content_type=f"multipart/form-data; boundary={boundary}"
    )


def _upload(content: bytes, name: str = "receipt.pdf") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/pdf")


@pytest.mark.parametrize("method", ["PATCH", "PUT"])
def test_multipart_bodies_of_other_methods_are_in_the_fingerprint(method: str) -> None:
    def form(amount: str, content: bytes = b"%PDF-1", boundary: str = BOUNDARY):
        return _multipart({"amount": amount, "file": _upload(content)}, boundary, method)

    request = form("100")
    printed = fingerprint(request)
    assert fingerprint(form("100", boundary="OtherBoundary42")) == printed
    assert fingerprint(form("101")) != printed
    assert fingerprint(form("100", b"%PDF-2")) != printed
    assert fingerprint(_multipart({"amount": "100"}, method=method)) != printed
    # the body is left whole for the view and its parsers
    data, files = request.parse_file_upload(request.META, BytesIO(request.body))
    assert data.getlist("amount") == ["100"]
    assert files["file"].read() == b"%PDF-1"


@pytest.mark.parametrize("method", ["PATCH", "PUT"])
def test_multipart_of_other_methods_keeps_the_order_of_repeated_fields(method: str) -> None:
    def form(*amounts: str):
        return _multipart({"amount": list(amounts), "note": "x"}, method=method)

    assert fingerprint(form("1", "100")) == fingerprint(form("1", "100"))
    assert fingerprint(form("1", "100")) != fingerprint(form("100", "1"))


@pytest.mark.parametrize("method", ["PATCH", "PUT"])
def test_malformed_multipart_of_other_methods_is_an_invalid_body(method: str) -> None:
    request = rf.generic(
        method, "/upload/", b"--x\r\nnot a part\r\n", content_type="multipart/form-data"
    )
    with pytest.raises(InvalidBody):
        fingerprint(request)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10)
def test_multipart_of_other_methods_over_the_upload_limit_is_request_too_large() -> None:
    request = _multipart({"note": "x" * 100}, method="PATCH")
    with pytest.raises(RequestTooLarge):
        preload_body(request)
    with pytest.raises(RequestTooLarge):
        fingerprint(_multipart({"note": "x" * 100}, method="PATCH"))


def _send_form(path: str, method: str, amount: str, boundary: str = BOUNDARY) -> Any:
    fields = {"amount": amount, "currency": "EUR", "receipt": _upload(b"receipt", "r.txt")}
    return Client().generic(
        method,
        path,
        encode_multipart(boundary, fields),
        content_type=f"multipart/form-data; boundary={boundary}",
        HTTP_IDEMPOTENCY_KEY="form-1",
    )


@pytest.mark.parametrize("path", ["/t/drf-form/", "/t/fn-form/"])
@pytest.mark.parametrize("method", ["PATCH", "PUT"])
def test_multipart_patch_and_put_replay_or_422_and_the_view_reads_the_form(
    path: str, method: str
) -> None:
    first = _send_form(path, method, "100")
    assert first.status_code == 201, first.content
    assert json.loads(first.content) == {
        "data": {"amount": ["100"], "currency": ["EUR"]},
        "files": {"receipt": ["receipt"]},
    }
    replay = _send_form(path, method, "100", boundary="AnotherBoundary7")
    assert replay[REPLAYED_HEADER] == "true"
    assert replay.content == first.content
    reused = _send_form(path, method, "101")
    assert reused.status_code == 422
    assert json.loads(reused.content)["type"].endswith("/key-reused")
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize("path", ["/t/drf-form/", "/t/fn-form/"])
def test_urlencoded_patch_replays_or_422_and_the_view_reads_the_form(path: str) -> None:
    def send(body: str) -> Any:
        return Client().generic(
            "PATCH",
            path,
            body,
            content_type="application/x-www-form-urlencoded",
            HTTP_IDEMPOTENCY_KEY="form-2",
        )

    first = send("amount=100&currency=EUR")
    assert first.status_code == 201, first.content
    assert json.loads(first.content)["data"] == {"amount": ["100"], "currency": ["EUR"]}
    assert send("currency=EUR&amount=100")[REPLAYED_HEADER] == "true"
    assert send("amount=101&currency=EUR").status_code == 422
    assert SideEffect.objects.count() == 1


def test_multipart_fingerprint_ignores_the_boundary_and_sees_the_files() -> None:
    def upload(content: bytes, name: str = "receipt.pdf") -> SimpleUploadedFile:
        return SimpleUploadedFile(name, content, content_type="application/pdf")

    a = _multipart({"amount": "100", "file": upload(b"%PDF-1 receipt")})
    b = _multipart({"file": upload(b"%PDF-1 receipt"), "amount": "100"}, boundary="OtherBoundary42")
    other_content = _multipart({"amount": "100", "file": upload(b"%PDF-1 receipt 2")})
    other_name = _multipart({"amount": "100", "file": upload(b"%PDF-1 receipt", "other.pdf")})
    other_field = _multipart({"amount": "101", "file": upload(b"%PDF-1 receipt")})
    assert a.META["CONTENT_TYPE"] != b.META["CONTENT_TYPE"]
    printed = fingerprint(a)
    assert fingerprint(b) == printed
    assert fingerprint(other_content) != printed
    assert fingerprint(other_name) != printed
    assert fingerprint(other_field) != printed
    # the uploaded file can still be read by the view after fingerprinting
    assert a.FILES["file"].read() == b"%PDF-1 receipt"


def test_multipart_content_type_constant_is_multipart() -> None:
    assert MULTIPART_CONTENT.startswith("multipart/form-data")


def test_fingerprint_is_hex_sha256() -> None:
    value = fingerprint(post("/pay/", "{}"))
    assert len(value) == 64
    int(value, 16)


def test_fingerprint_leaves_the_body_readable() -> None:
    request = post("/pay/", '{"amount": 1}')
    fingerprint(request)
    assert json.loads(request.body) == {"amount": 1}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10)
def test_body_over_the_upload_limit_is_request_too_large() -> None:
    with pytest.raises(RequestTooLarge) as info:
        fingerprint(post("/pay/", '{"amount": 100000}'))
    assert info.value.status == 413
    with pytest.raises(RequestTooLarge):
        preload_body(post("/pay/", '{"amount": 100000}'))


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10)
def test_multipart_over_the_upload_limit_is_request_too_large() -> None:
    request = _multipart({"note": "x" * 100})
    preload_body(request)  # multipart is left to the form parser
    with pytest.raises(RequestTooLarge):
        fingerprint(request)


# -- downstream keys and scopes -------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=é"],
)
def test_malformed_multipart_is_an_invalid_body(content_type: str) -> None:
    request = rf.generic("POST", "/upload/", b"--x\r\nnot a part\r\n", content_type=content_type)
    with pytest.raises(InvalidBody) as info:
        fingerprint(request)
    assert info.value.status == 400


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=2)
def test_multipart_with_too_many_fields_is_an_invalid_body() -> None:
    with pytest.raises(InvalidBody):
        fingerprint(_multipart({"a": "1", "b": "2", "c": "3"}))


@override_settings(DATA_UPLOAD_MAX_NUMBER_FILES=1)
def test_multipart_with_too_many_files_is_an_invalid_body() -> None:
    files: dict[str, object] = {f"f{i}": SimpleUploadedFile(f"{i}.txt", b"x") for i in range(3)}
    with pytest.raises(InvalidBody):
        fingerprint(_multipart(files))
