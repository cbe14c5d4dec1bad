"""Properties of request fingerprints (django_idempotency.protocol.fingerprint)."""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from django.test import RequestFactory
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from django_idempotency.protocol.fingerprint import fingerprint

rf = RequestFactory()
fast = settings(max_examples=200, deadline=None)


# -- JSON documents whose numbers keep their text ------------------------------------------


@dataclass(frozen=True)
class Num:
    """A JSON number as it is written; equal only to the same text."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object; members compare as a dict (their order does not count)."""

    members: tuple[tuple[str, Any], ...]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Obj) and dict(self.members) == dict(other.members)

    def __hash__(self) -> int:
        return hash(frozenset(name for name, _ in self.members))


digits = st.text(string.digits, min_size=1, max_size=25)
numbers = st.builds(
    lambda sign, whole, fraction, exponent: sign + whole + fraction + exponent,
    st.sampled_from(["", "-"]),
    st.integers(min_value=0, max_value=10**25).map(str),
    st.one_of(st.just(""), digits.map(lambda d: "." + d)),
    st.one_of(
        st.just(""),
        st.builds("{}{}{}".format, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), digits),
    ),
)
texts = st.text(st.characters(codec="utf-8"), max_size=12)  # no lone surrogates: see test_keys
scalars = st.one_of(st.none(), st.booleans(), numbers.map(Num), texts)


def _objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    return st.dictionaries(texts, children, max_size=5).map(lambda d: Obj(tuple(d.items())))


documents = st.recursive(
    scalars, lambda children: st.lists(children, max_size=5) | _objects(children), max_leaves=12
)


def render(value: Any, rnd: random.Random) -> str:
    """``value`` as JSON text, with object members shuffled and whitespace sprinkled in."""

    def pad() -> str:
        return "".join(rnd.choice(" \t\r\n") for _ in range(rnd.randrange(3)))

    if isinstance(value, Num):
        return pad() + value.text
    if isinstance(value, Obj):
        members = list(value.members)
        rnd.shuffle(members)
        inner = ",".join(
            f"{pad()}{json.dumps(name, ensure_ascii=rnd.random() < 0.5)}{pad()}:"
            + render(member, rnd)
            for name, member in members
        )
        return f"{pad()}{{{inner}{pad()}}}"
    if isinstance(value, list):
        return f"{pad()}[{','.join(render(item, rnd) for item in value)}{pad()}]"
    return pad() + json.dumps(value, ensure_ascii=rnd.random() < 0.5)


randoms = st.randoms(use_true_random=False)


def post_json(body: str, method: str = "POST", path: str = "/pay/") -> str:
    return fingerprint(rf.generic(method, path, body.encode(), content_type="application/json"))


@fast
@given(documents, randoms)
def test_the_same_json_in_any_member_order_and_spacing_has_one_fingerprint(
    document: Any, rnd: random.Random
) -> None:
    assert post_json(render(document, rnd)) == post_json(render(document, rnd))


@fast
@given(documents, documents, randoms)
def test_json_documents_of_different_meaning_have_different_fingerprints(
    one: Any, other: Any, rnd: random.Random
) -> None:
    same = post_json(render(one, rnd)) == post_json(render(other, rnd))
    assert same == (one == other)


@fast
@given(numbers, numbers, texts, texts, documents, documents, randoms)
def test_a_changed_number_text_string_or_value_changes_the_fingerprint(
    amount: str,
    other_amount: str,
    note: str,
    other_note: str,
    rest: Any,
    other_rest: Any,
    rnd: random.Random,
) -> None:
    def body(amount: str, note: str, rest: Any) -> str:
        members = (("amount", Num(amount)), ("note", note), ("rest", rest))
        return render(Obj(members), rnd)

    printed = post_json(body(amount, note, rest))
    if amount != other_amount:
        assert post_json(body(other_amount, note, rest)) != printed
    if note != other_note:
        assert post_json(body(amount, other_note, rest)) != printed
    if other_rest != rest:
        assert post_json(body(amount, note, other_rest)) != printed


# -- method, path and query ----------------------------------------------------------------

methods = st.sampled_from(["POST", "PATCH", "PUT", "DELETE"])
# Segments joined by single slashes: a request line's "//x" is a network-path reference,
# whose "x" is a host to the URL parser, not part of the path.
segments = st.text(string.ascii_letters + string.digits + "-._~", min_size=1, max_size=6)
paths = st.lists(segments, max_size=3).map(lambda parts: "/" + "/".join(parts))
names = st.text(string.ascii_lowercase[:4], min_size=1, max_size=2)
values = st.text(st.characters(codec="utf-8"), max_size=6)
pairs = st.lists(st.tuples(names, values), max_size=8)


def by_name(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What the fingerprint sees of a query or form: names sorted, a name's values in order."""
    return sorted(items, key=lambda pair: pair[0])


def regroup(items: list[tuple[str, str]], draw: Any) -> list[tuple[str, str]]:
    """The same pairs in another order, the values of each name in theirs."""
    queues = {name: [pair for pair in items if pair[0] == name] for name, _ in items}
    order = draw(st.permutations([name for name, _ in items]))
    return [queues[name].pop(0) for name in order]


def request_print(method: str, path: str, query: list[tuple[str, str]]) -> str:
    url = path + "?" + urlencode(query, quote_via=quote) if query else path
    return fingerprint(rf.generic(method, url, b"{}", content_type="application/json"))


@fast
@given(methods, paths, pairs, st.data())
def test_other_names_may_move_but_a_names_values_keep_their_order(
    method: str, path: str, query: list[tuple[str, str]], data: st.DataObject
) -> None:
    assert request_print(method, path, query) == request_print(
        method, path, regroup(query, data.draw)
    )


@fast
@given(methods, paths, pairs, methods, paths, pairs)
def test_method_path_and_query_each_count(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    other_method: str,
    other_path: str,
    other_query: list[tuple[str, str]],
) -> None:
    same = request_print(method, path, query) == request_print(
        other_method, other_path, other_query
    )
    assert same == (
        (method, path, by_name(query)) == (other_method, other_path, by_name(other_query))
    )


@fast
@given(paths, pairs, names, values, values)
def test_swapping_two_values_of_a_repeated_name_changes_the_fingerprint(
    path: str, query: list[tuple[str, str]], name: str, first: str, second: str
) -> None:
    assume(first != second)
    before = [*query, (name, first), (name, second)]
    after = [*query, (name, second), (name, first)]
    assert request_print("POST", path, before) != request_print("POST", path, after)


@fast
@given(pairs, pairs, st.data())
def test_urlencoded_forms_follow_the_same_rules(
    form: list[tuple[str, str]], other_form: list[tuple[str, str]], data: st.DataObject
) -> None:
    def form_print(items: list[tuple[str, str]]) -> str:
        body = urlencode(items, quote_via=quote)
        return fingerprint(
            rf.generic("PATCH", "/f/", body, content_type="application/x-www-form-urlencoded")
        )

    assert form_print(form) == form_print(regroup(form, data.draw))
    assert (form_print(form) == form_print(other_form)) == (by_name(form) == by_name(other_form))
