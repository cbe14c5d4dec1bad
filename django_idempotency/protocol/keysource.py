"""Where a request's idempotency key is read: the header (``HEADER``, parsed by
:func:`header.parse_key`), a top-level field of a JSON body (``KEY_BODY_FIELD``, as Square's
API takes it), or a view's own hook (``get_idempotency_key``, ``key=``); the rules a key
from the body or a hook follows, and the rule when the header and the body both carry one
(see docs/how-it-works.md, "Where the key is read").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from django.http.request import RawPostDataException
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..errors import InvalidBody, InvalidKey
from .body import Body, is_json, is_object, load
from .header import MAX_KEY_LENGTH, header_value, parse_key

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: A view's own key hook: ``(request) -> the key as the client sent it, or None``.
KeyFunc = Callable[[HttpRequest], Any]


def request_key(request: HttpRequest) -> str | None:
    """The key the request carries in the header or in the ``KEY_BODY_FIELD`` of its JSON
    body, validated; None when it carries none. When both carry one, they must be the same
    key (``InvalidKey`` otherwise): which of two keys a retry meant cannot be guessed."""
    raw = header_value(request, conf.HEADER)
    header = None if raw is None else parse_key(raw)
    field = conf.KEY_BODY_FIELD
    if field is None or not may_carry_body_key(request):
        return header
    body = body_key(request, field, readable=header is None)
    if body is not None and header is not None and body != header:
        raise InvalidKey(
            format_lazy(
                _(
                    'The {header} header and the body field "{field}" carry different keys; '
                    "send the key once, or the same key in both."
                ),
                header=conf.HEADER,
                field=field,
            )
        )
    return header if header is not None else body


def may_carry_body_key(request: HttpRequest) -> bool:
    """Whether the request's body can hold a key: ``KEY_BODY_FIELD`` is set and the body is
    JSON. Reads the headers only (no body), so it is safe on the event loop."""
    content_type = request.META.get("CONTENT_TYPE", "")
    return conf.KEY_BODY_FIELD is not None and is_json(content_type)


def body_key(request: HttpRequest, field: str, *, readable: bool = True) -> str | None:
    """The validated key in the top-level ``field`` of the JSON body; None when the body is
    empty, not a JSON object, or has no such field. A body that is not JSON is an
    ``InvalidBody`` when ``readable`` (no other key was sent: whether this one carries a key
    cannot be told), else it has none."""
    body = _body(request)
    if not body.raw:
        return None
    try:
        parsed = body.json()
    except (ValueError, RecursionError):
        if not readable:
            return None
        raise InvalidBody(
            format_lazy(
                _(
                    "The request body is not valid JSON, so the idempotency key in its field "
                    '"{field}" cannot be read. Send valid JSON, or the key in the {header} header.'
                ),
                field=field,
                header=conf.HEADER,
            )
        ) from None
    if not is_object(parsed):
        return None
    values = [value for name, value in parsed if name == field]
    if not values:
        return None
    if len(values) > 1:
        raise InvalidKey(
            format_lazy(_('The body field "{field}" appears more than once.'), field=field)
        )
    return check_key(values[0], field)


def _body(request: HttpRequest) -> Body:
    """The request's body (:func:`body.load`: read and parsed once, for the key, the
    fingerprint and the view). A body that something read as a stream before the key could
    be is an ``InvalidBody``: nothing can be told about its key, nor can it be
    fingerprinted."""
    try:
        return load(request)
    except RawPostDataException as exc:
        raise InvalidBody(
            _(
                "The request body was read before its idempotency key, so the key cannot be "
                "read from it and the body cannot be fingerprinted."
            )
        ) from exc


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
    if not (value.isascii() and value.isprintable() and " " not in value):
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


def missing_detail(hook: bool) -> StrOrPromise:
    """The detail of a ``MissingKey``: where the key is expected."""
    if hook:
        return _("This endpoint requires an idempotency key.")
    field = conf.KEY_BODY_FIELD
    if field is None:
        return format_lazy(_("This endpoint requires an {header} header."), header=conf.HEADER)
    return format_lazy(
        _(
            'This endpoint requires an idempotency key: an {header} header, or a "{field}" '
            "field in a JSON body."
        ),
        header=conf.HEADER,
        field=field,
    )
