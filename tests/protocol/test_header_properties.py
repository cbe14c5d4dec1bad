"""Properties of Idempotency-Key parsing (django_idempotency.protocol.header)."""

from __future__ import annotations

import base64
import string

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from django_idempotency.errors import InvalidKey
from django_idempotency.protocol.header import MAX_KEY_LENGTH, parse_key

fast = settings(max_examples=200, deadline=None)

# -- the Idempotency-Key header ------------------------------------------------------------

VISIBLE = "".join(chr(c) for c in range(0x21, 0x7F))
keys = st.text(VISIBLE, min_size=1, max_size=MAX_KEY_LENGTH)
bare_keys = st.text(VISIBLE.replace(",", "").replace(";", ""), min_size=1, max_size=MAX_KEY_LENGTH)
blanks = st.text(" \t", max_size=2)

sf_strings = st.text(string.printable[:95].replace("\t", " "), max_size=8).map(
    lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
)
bare_items = st.one_of(
    st.from_regex(r"-?[0-9]{1,15}", fullmatch=True),
    st.from_regex(r"-?[0-9]{1,12}\.[0-9]{1,3}", fullmatch=True),
    sf_strings,
    st.from_regex(r"[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]{0,8}", fullmatch=True),
    st.builds(
        lambda raw, padded: ":" + (raw if padded else raw.rstrip("=")) + ":",
        st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
        st.booleans(),
    ),
    st.sampled_from(["?0", "?1"]),
)
parameter = st.tuples(
    st.text(" ", max_size=2),
    st.from_regex(r"[a-z*][a-z0-9_.*-]{0,6}", fullmatch=True),
    st.none() | bare_items,
).map(lambda p: f";{p[0]}{p[1]}" + ("" if p[2] is None else f"={p[2]}"))
parameters = st.lists(parameter, max_size=3).map("".join)


def quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


header_like = st.one_of(
    st.text(),
    st.text(VISIBLE + " \t"),
    st.builds(lambda key, rest: quoted(key) + rest, keys, st.text(VISIBLE + " ")),
    st.builds(lambda text: '"' + text, st.text()),
)


@fast
@given(header_like)
def test_parse_key_raises_nothing_but_invalid_key(raw: str) -> None:
    try:
        key = parse_key(raw)
    except InvalidKey:
        return
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert all(0x21 <= ord(ch) <= 0x7E for ch in key)


@fast
@given(bare_keys, blanks, blanks)
def test_a_bare_key_round_trips(key: str, before: str, after: str) -> None:
    assume(not key.startswith('"'))
    assert parse_key(before + key + after) == key


@fast
@given(keys, parameters, blanks, blanks)
def test_a_quoted_key_round_trips_with_any_parameters(
    key: str, params: str, before: str, after: str
) -> None:
    assert parse_key(before + quoted(key) + params + after) == key


@fast
@given(st.lists(keys, min_size=2, max_size=3), st.sampled_from([",", ", ", " ,"]), st.booleans())
def test_a_list_of_keys_is_refused(items: list[str], comma: str, quote_them: bool) -> None:
    # (a bare first key that starts with a quote would be read as the quoted form)
    assume(quote_them or not items[0].startswith('"'))
    header = comma.join(quoted(key) if quote_them else key for key in items)
    try:
        parse_key(header)
    except InvalidKey:
        return
    raise AssertionError(f"{header!r} was accepted")
