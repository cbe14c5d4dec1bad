"""The Idempotency-Key header: what is accepted, what is refused, and how."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from django_idempotency.errors import InvalidKey
from django_idempotency.protocol.header import MAX_KEY_LENGTH, parse_key
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..testapp.models import SideEffect

pytestmark = pytest.mark.django_db


# -- parse_key ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("abc", "abc"),
        ("  abc\t", "abc"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"abc"', "abc"),
        ('  "abc"  ', "abc"),
        (r'"a\"b"', 'a"b'),
        (r'"a\\b"', "a\\b"),
        ("a\"b'c", "a\"b'c"),  # a bare key may contain a quote after its first character
        ("!#$%&'*+-.^_`|~", "!#$%&'*+-.^_`|~"),
        ("k" * MAX_KEY_LENGTH, "k" * MAX_KEY_LENGTH),
        ('"' + "k" * MAX_KEY_LENGTH + '"', "k" * MAX_KEY_LENGTH),
        # RFC 8941 parameters on the quoted form are parsed and ignored
        ('"abc";p=1', "abc"),
        ('"abc";p', "abc"),
        ('"abc"; p=1;q', "abc"),
        ('"a;b,c";p=1', "a;b,c"),
        ('"abc";a=-1;b=1.5;c=-123456789012.123;d=?0;e=?1;f="x\\"y;z"', "abc"),
        ('"abc";g=tok/en:1*;h=*;i=:aGVsbG8=:;j=:aGVsbG8:;k=::;*l-._*=1', "abc"),
        ('"abc";i=:aG=:;j=:aGk=:;k=:aGk:', "abc"),  # padding left out, or made up in part
        ('"abc";p=123456789012345', "abc"),
    ],
)
def test_parse_key_accepts(raw: str, expected: str) -> None:
    assert parse_key(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ('""', "empty"),
        ('"abc', "no closing quote"),
        ('"abc\\"', "no closing quote"),
        ('"abc"def', "text after"),
        ('"abc" ;p=1', "text after"),
        ('"abc";p=1 x', "text after"),
        # a list: the header sent twice is joined into one line with a comma
        ("k1,k2", "list of keys"),
        ("k1, k2", "list of keys"),
        ("k1,", "list of keys"),
        (",k2", "list of keys"),
        ("k1;p=1,k2", "list of keys"),
        ('"k1", "k2"', "list of keys"),
        ('"k1","k2"', "list of keys"),
        ('"k1";p=1, "k2"', "list of keys"),
        ('k1, "k2"', "list of keys"),
        # parameters need the quoted form
        ("abc;p=1", "may not contain ';'"),
        ("abc;", "may not contain ';'"),
        # malformed parameters
        ('"abc";', "parameter name"),
        ('"abc";P=1', "parameter name"),
        ('"abc";1=1', "parameter name"),
        ('"abc";p=', "parameter value"),
        ('"abc";p=1.', "number"),
        ('"abc";p=1.2345', "number"),
        ('"abc";p=1234567890123.5', "number"),
        ('"abc";p=1234567890123456', "number"),
        ('"abc";p=-', "number"),
        ('"abc";p=-a', "number"),
        ('"abc";p=?2', "boolean"),
        ('"abc";p=?', "boolean"),
        ('"abc";p=:aGVsbG8', "byte sequence"),
        ('"abc";p=:aGV$bG8=:', "byte sequence"),
        # base64 that no strict decoder reads, padding made up or not
        ('"abc";p=:=:', "byte sequence"),
        ('"abc";p=:a:', "byte sequence"),
        ('"abc";p=:aGVsb:', "byte sequence"),
        ('"abc";p=:aGk==:', "byte sequence"),
        ('"abc";p=:aGVs=:', "byte sequence"),
        ('"abc";p=:a=Gk:', "byte sequence"),
        ('"abc";p=:aG==aGk=:', "byte sequence"),
        ('"abc";p="x', "no closing quote"),
        ('"abc";p="x\\n"', "invalid escape"),
        ('"abc";p=%x', "parameter value"),
        ('"a\\nb"', "invalid escape"),
        ('"abc\\', "invalid escape"),
        ('"a b"', "visible ASCII"),
        ("a b", "visible ASCII"),
        ("a\x00b", "visible ASCII"),
        ("a\x7fb", "visible ASCII"),
        ("ab\x1b", "visible ASCII"),
        ('"a\tb"', "not ASCII"),
        ("clé", "visible ASCII"),
        ('"clé"', "not ASCII"),
        ("k" * (MAX_KEY_LENGTH + 1), "longer than 255"),
        ('"' + "k" * (MAX_KEY_LENGTH + 1) + '"', "longer than 255"),
    ],
)
def test_parse_key_rejects(raw: str, reason: str) -> None:
    with pytest.raises(InvalidKey) as info:
        parse_key(raw)
    assert reason in info.value.detail
    assert info.value.status == 400
    assert info.value.type_uri.endswith("/invalid-key")


@pytest.mark.parametrize("header", ["k1,k2", "k1, k2", '"k1", "k2"', "k1;p=1"])
def test_a_list_or_a_bare_key_with_parameters_is_400_through_a_view(header: str) -> None:
    response = Client().post("/t/fn/", b"{}", "application/json", HTTP_IDEMPOTENCY_KEY=header)
    assert response.status_code == 400
    assert json.loads(response.content)["type"].endswith("/invalid-key")
    assert SideEffect.objects.count() == 0


def test_parameters_on_a_quoted_key_are_ignored_through_a_view() -> None:
    def send(header: str) -> Any:
        return Client().post("/t/fn/", b"{}", "application/json", HTTP_IDEMPOTENCY_KEY=header)

    assert send("abc").status_code == 201
    assert send('"abc";v=2')[REPLAYED_HEADER] == "true"
    assert SideEffect.objects.count() == 1
