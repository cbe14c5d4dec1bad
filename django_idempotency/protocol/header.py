"""What an idempotency key is (:func:`check_key`: 1 to ``MAX_KEY_LENGTH`` visible ASCII
characters), and the ``Idempotency-Key`` header that carries it: the bare form and the RFC
8941 sf-string with its parameters (:func:`parse_key`; see docs/how-it-works.md, "The
Idempotency-Key header")."""

from __future__ import annotations

import re
import string
from functools import lru_cache
from typing import TYPE_CHECKING

from django.http import HttpRequest
from django.http.request import HttpHeaders
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from ..errors import InvalidKey

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

MAX_KEY_LENGTH = 255


@lru_cache(maxsize=64)
def _meta_name(header: str) -> str:
    return HttpHeaders.to_wsgi_name(header)


def header_value(request: HttpRequest, header: str) -> str | None:
    """The request's ``header`` (any case), or None: read from ``request.META``, as
    ``request.headers`` is built, without building ``request.headers`` (a dict of every
    header) on every request."""
    value: str | None = request.META.get(_meta_name(header))
    return value


def _is_visible_ascii(value: str) -> bool:
    """Only 0x21-0x7E: ASCII, printable (0x20-0x7E) and no space."""
    return value.isascii() and value.isprintable() and " " not in value


def parse_key(raw: str) -> str:
    """Return the key carried by a header value, or raise InvalidKey.

    Accepts the structured-field string form of RFC 8941 /
    draft-ietf-httpapi-idempotency-key-header (``"abc"``), with any well-formed
    parameters (``"abc";p=1``), which are ignored, and the bare form (``abc``),
    which may not contain ``,`` or ``;``. A list of keys, which is what a header
    sent twice becomes, is refused.
    """
    value = raw.strip(" \t")
    if value.startswith('"'):
        value = _parse_sf_item(value)
    elif "," in value:
        raise InvalidKey(_LIST_OF_KEYS)
    elif ";" in value:
        raise InvalidKey(
            _(
                "A bare Idempotency-Key may not contain ';'. Parameters are accepted only "
                'after a quoted key ("key";name=value).'
            )
        )
    if not value:
        raise InvalidKey(_("The Idempotency-Key header is empty."))
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKey(
            format_lazy(
                _("The Idempotency-Key is longer than {max_length} characters."),
                max_length=MAX_KEY_LENGTH,
            )
        )
    if not _is_visible_ascii(value):
        raise InvalidKey(
            _(
                "The Idempotency-Key may only contain visible ASCII characters "
                "(no spaces or control characters)."
            )
        )
    return value


def check_key(value: object, field: str | None = None) -> str:
    """``value`` when it is a key: a string of 1 to ``MAX_KEY_LENGTH`` visible ASCII
    characters, as a bare header key is; ``InvalidKey`` naming the body's ``field`` (or the
    key, for a hook's) otherwise. Unlike the header, a quoted value is not unquoted."""
    problem = _key_problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value
    messages = _FIELD_PROBLEMS if field is not None else _HOOK_PROBLEMS
    raise InvalidKey(format_lazy(messages[problem], field=field, max_length=MAX_KEY_LENGTH))


def _key_problem(value: object) -> str | None:
    # Not isinstance(): a JSON number from the body is a str subclass (its text, as sent).
    if type(value) is not str:
        return "type"
    if not value:
        return "empty"
    if len(value) > MAX_KEY_LENGTH:
        return "length"
    if not _is_visible_ascii(value):
        return "characters"
    return None


#: What is wrong with a key in the body's field, by problem: whole sentences, translated.
_FIELD_PROBLEMS: dict[str, StrOrPromise] = {
    "type": _('The body field "{field}" must be a string: the idempotency key.'),
    "empty": _('The body field "{field}" is empty; it must hold the idempotency key.'),
    "length": _(
        'The idempotency key in the body field "{field}" is longer than {max_length} characters.'
    ),
    "characters": _(
        'The idempotency key in the body field "{field}" may only contain visible ASCII '
        "characters (no spaces or control characters)."
    ),
}
#: The same for a key that a view's own hook returned.
_HOOK_PROBLEMS: dict[str, StrOrPromise] = {
    "type": _("The idempotency key must be a string."),
    "empty": _("The idempotency key is empty."),
    "length": _("The idempotency key is longer than {max_length} characters."),
    "characters": _(
        "The idempotency key may only contain visible ASCII characters "
        "(no spaces or control characters)."
    ),
}


_LIST_OF_KEYS = _(
    "The Idempotency-Key header holds a list of keys (it was sent more than once, or its "
    "value contains a comma); send exactly one key."
)
#: The subjects of the sf-string messages: the key itself, or a parameter's string value.
_KEY = "key"
_PARAMETER = "parameter"
#: What is wrong with an sf-string, by subject: whole sentences, for the translations.
_SF_STRING_ERRORS = {
    (_KEY, "escape"): _("The quoted Idempotency-Key has an invalid escape."),
    (_KEY, "not-ascii"): _("The quoted Idempotency-Key contains a character that is not ASCII."),
    (_KEY, "unclosed"): _("The quoted Idempotency-Key has no closing quote."),
    (_PARAMETER, "escape"): _("A parameter of the Idempotency-Key has an invalid escape."),
    (_PARAMETER, "not-ascii"): _(
        "A parameter of the Idempotency-Key contains a character that is not ASCII."
    ),
    (_PARAMETER, "unclosed"): _("A parameter of the Idempotency-Key has no closing quote."),
}

# RFC 8941 section 3.1.2 (parameter names) and 3.3 (bare items).
_DIGITS = frozenset(string.digits)
_PARAM_NAME_START = frozenset(string.ascii_lowercase + "*")
_PARAM_NAME = _PARAM_NAME_START | _DIGITS | frozenset("_-.")
_TOKEN_START = frozenset(string.ascii_letters + "*")
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~:/")

#: The content of an RFC 8941 byte sequence (between its colons): base64 that a strict
#: decoder reads once the padding left out is made up to a multiple of four characters,
#: as section 4.2.7 asks of parsers. So ``aGk=``, ``aGk`` and ``aG=`` are accepted, and
#: padding that is not at the end (``a=Gk``), in excess (``aGk==``, ``aGVs=``) or alone
#: (``=``), or one character too many (``aGVsb``), is not. An ECMA-262 pattern that
#: Python's ``re`` reads alike: the OpenAPI schema of the header uses it as it is.
BYTE_SEQUENCE_PATTERN = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}={0,2}|[A-Za-z0-9+/]{3}=?)?"
_BYTE_SEQUENCE = re.compile(BYTE_SEQUENCE_PATTERN)


def _parse_sf_item(value: str) -> str:
    """The string of an RFC 8941 Item whose bare item is an sf-string; its
    parameters are checked and ignored (the header defines none)."""
    key, i = _parse_sf_string(value, 0, _KEY)
    n = len(value)
    after = _("The quoted Idempotency-Key has text after its closing quote.")
    while i < n and value[i] == ";":
        i += 1
        while i < n and value[i] == " ":
            i += 1
        i = _skip_parameter_name(value, i)
        if i < n and value[i] == "=":
            i = _skip_bare_item(value, i + 1)
        after = _("The quoted Idempotency-Key has text after its parameters.")
    if i < n:
        if value[i:].lstrip(" \t").startswith(","):
            raise InvalidKey(_LIST_OF_KEYS)
        raise InvalidKey(after)
    return key


def _parse_sf_string(value: str, i: int, subject: str) -> tuple[str, int]:
    """Decode the sf-string that starts at ``value[i]`` (a quote); return it and the
    index after its closing quote."""
    out: list[str] = []
    i += 1
    n = len(value)
    while i < n:
        ch = value[i]
        if ch == "\\":
            if i + 1 >= n or value[i + 1] not in '"\\':
                raise InvalidKey(_SF_STRING_ERRORS[subject, "escape"])
            out.append(value[i + 1])
            i += 2
            continue
        if ch == '"':
            return "".join(out), i + 1
        if not 0x20 <= ord(ch) <= 0x7E:
            raise InvalidKey(_SF_STRING_ERRORS[subject, "not-ascii"])
        out.append(ch)
        i += 1
    raise InvalidKey(_SF_STRING_ERRORS[subject, "unclosed"])


def _malformed(what: StrOrPromise) -> InvalidKey:
    return InvalidKey(
        format_lazy(_("The Idempotency-Key has a malformed parameter: {what}."), what=what)
    )


def _skip_parameter_name(value: str, i: int) -> int:
    if i >= len(value) or value[i] not in _PARAM_NAME_START:
        raise _malformed(_("a parameter name starts with a lowercase letter or '*'"))
    i += 1
    while i < len(value) and value[i] in _PARAM_NAME:
        i += 1
    return i


def _skip_bare_item(value: str, i: int) -> int:
    """The index after the parameter value (an RFC 8941 bare item) at ``value[i]``."""
    n = len(value)
    ch = value[i] if i < n else ""
    if ch == '"':
        return _parse_sf_string(value, i, _PARAMETER)[1]
    if ch == "-" or ch in _DIGITS:
        return _skip_number(value, i)
    if ch in _TOKEN_START:
        i += 1
        while i < n and value[i] in _TOKEN:
            i += 1
        return i
    if ch == "?":
        if value[i + 1 : i + 2] not in ("0", "1"):
            raise _malformed(_("a boolean is ?0 or ?1"))
        return i + 2
    if ch == ":":
        end = value.find(":", i + 1)
        if end < 0 or not _BYTE_SEQUENCE.fullmatch(value, i + 1, end):
            raise _malformed(_("a byte sequence is base64 between colons"))
        return end + 1
    raise _malformed(_("a parameter value is a number, string, token, byte sequence or boolean"))


def _skip_number(value: str, i: int) -> int:
    """RFC 8941 section 4.2.4: up to 15 digits, or 12 digits, '.' and 1 to 3 digits."""
    n = len(value)
    if value[i] == "-":
        i += 1
    start = i
    while i < n and value[i] in _DIGITS:
        i += 1
    whole = i - start
    if whole == 0 or whole > 15:
        raise _malformed(_("a number has 1 to 15 digits"))
    if i < n and value[i] == ".":
        i += 1
        fraction_start = i
        while i < n and value[i] in _DIGITS:
            i += 1
        if whole > 12 or not 1 <= i - fraction_start <= 3:
            raise _malformed(_("a decimal number has up to 12 digits, '.' and 1 to 3 digits"))
    return i
