"""Where a request's idempotency key is read: the header (``HEADER``, parsed by
:func:`header.parse_key`), a top-level field of a JSON body (``KEY_BODY_FIELD``, as Square's
API takes it), or a view's own hook (``get_idempotency_key``, ``key=``); the rule when the
header and the body both carry one (see docs/how-it-works.md, "Where the key is read").
What a key from the body or a hook must be is :func:`header.check_key`'s, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..errors import InvalidBody, InvalidKey
from .body import is_json, member_values, preload
from .header import check_key, header_value, parse_key

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

__all__ = ["KeyFunc", "check_key", "may_carry_body_key", "missing_detail", "request_key"]

#: A view's own key hook: ``(request) -> the key as the client sent it, or None``.
KeyFunc = Callable[[HttpRequest], Any]


def request_key(request: HttpRequest, hook: KeyFunc | None = None) -> str | None:
    """The validated key of ``request``; None when it carries none. ``hook`` is a view's own
    key hook, whose key :func:`header.check_key` validates; without one, the key is the
    header's or the ``KEY_BODY_FIELD``'s of a JSON body, and when both carry one they must be
    the same key (``InvalidKey`` otherwise): which of two keys a retry meant cannot be
    guessed.

    The body is read first, once (:mod:`.body`): for a hook that parses it (it is then still
    there for the fingerprint and the view), or for its key field. A JSON body that is not
    valid JSON is an ``InvalidBody`` when the header carries no key (whether the body
    carries one cannot be told), else it carries none."""
    field = conf.KEY_BODY_FIELD if hook is None else None
    values: list[Any] | None = []
    if hook is not None:
        preload(request)
    elif field is not None and is_json(request.META.get("CONTENT_TYPE", "")):
        values = member_values(request, field)  # None: not JSON
    if hook is not None:
        raw = hook(request)
        return None if raw is None else check_key(raw)
    raw = header_value(request, conf.HEADER)
    header = None if raw is None else parse_key(raw)
    if values is None and header is None:
        raise InvalidBody(format_lazy(_NOT_JSON, field=field, header=conf.HEADER))
    if not values:
        return header
    if len(values) > 1:
        raise InvalidKey(format_lazy(_REPEATED, field=field))
    body = check_key(values[0], field)
    if header is not None and body != header:
        raise InvalidKey(format_lazy(_TWO_KEYS, header=conf.HEADER, field=field))
    return body


def may_carry_body_key(request: HttpRequest) -> bool:
    """Whether the request's body can hold a key: ``KEY_BODY_FIELD`` is set and the body is
    JSON. Reads the headers only (no body), so it is safe on the event loop."""
    content_type = request.META.get("CONTENT_TYPE", "")
    return conf.KEY_BODY_FIELD is not None and is_json(content_type)


_NOT_JSON = _(
    'The request body is not valid JSON, so the idempotency key in its field "{field}" '
    "cannot be read. Send valid JSON, or the key in the {header} header."
)
_REPEATED = _('The body field "{field}" appears more than once.')
_TWO_KEYS = _(
    'The {header} header and the body field "{field}" carry different keys; '
    "send the key once, or the same key in both."
)


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
