"""Whether a retry accepts the stored representation: its ``Accept`` header (RFC 9110,
section 12.5.1) and, on Django REST framework views, DRF's ``?format=`` URL override.

A replay is the response of the execution that committed; it is never rendered again. So
a retry that does not accept its media type is not answered with it (a client would be
handed a body it cannot parse) but with ``ReplayNotAcceptable`` (406), which says the
request has completed. See docs/how-it-works.md, "Replays and content negotiation".
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from .header import header_value

#: At most this many media ranges of an ``Accept`` header are read (as DRF does); the
#: rest are ignored, so a hostile header costs bounded work.
MAX_ACCEPT_RANGES = 64
#: An ``Accept`` header longer than this is read up to its last comma before the limit.
MAX_ACCEPT_LENGTH = 8192


@dataclass(frozen=True)
class MediaType:
    """``type/subtype`` (lower-cased) and its parameters (names lower-cased)."""

    type: str
    subtype: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def suffix(self) -> str | None:
        """The structured syntax suffix (``json`` of ``application/vnd.api+json``)."""
        _, plus, suffix = self.subtype.rpartition("+")
        return suffix if plus and suffix else None


@dataclass(frozen=True)
class MediaRange:
    """One element of an ``Accept`` header: a media type, maybe with wildcards, and its q."""

    media: MediaType
    q: float


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def parse_media_type(text: str) -> tuple[MediaType, float | None] | None:
    """``type/subtype;name=value...`` and the value of a ``q`` parameter (None without
    one); None when it is not a media type. Parameters after ``q`` (RFC 9110's
    accept-ext) are dropped."""
    head, *rest = text.split(";")
    kind, slash, subtype = head.strip().lower().partition("/")
    if not slash or not kind or not subtype or "/" in subtype or " " in head.strip():
        return None
    params: list[tuple[str, str]] = []
    q: float | None = None
    for item in rest:
        name, equals, value = item.partition("=")
        name = name.strip().lower()
        if not equals or not name:
            continue
        if name == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            if not 0.0 <= q <= 1.0:
                return None
            break
        params.append((name, _unquote(value)))
    return MediaType(kind, subtype, tuple(params)), q


def parse_accept(header: str) -> list[MediaRange]:
    """The well-formed media ranges of an ``Accept`` header, in order (malformed ones
    are skipped)."""
    if len(header) > MAX_ACCEPT_LENGTH:
        header = header[: header.rfind(",", 0, MAX_ACCEPT_LENGTH) + 1]
    ranges: list[MediaRange] = []
    for element in header.split(",")[: MAX_ACCEPT_RANGES * 2]:
        parsed = parse_media_type(element) if element.strip() else None
        if parsed is None:
            continue
        media, q = parsed
        if media.type == "*" and media.subtype != "*":
            continue  # "*/json" is no media range
        ranges.append(MediaRange(media, 1.0 if q is None else q))
        if len(ranges) == MAX_ACCEPT_RANGES:
            break
    return ranges


def _params_match(wanted: Iterable[tuple[str, str]], offered: MediaType) -> bool:
    """Each parameter of the range is one of the stored type's. A ``charset`` the stored
    type does not name is no conflict (JSON has none: it is UTF-8)."""
    have = dict(offered.params)
    for name, value in wanted:
        if name not in have:
            if name == "charset":
                continue
            return False
        same = have[name].lower() == value.lower() if name == "charset" else have[name] == value
        if not same:
            return False
    return True


def specificity(media_range: MediaType, offered: MediaType) -> int:
    """How specifically ``media_range`` matches ``offered``, -1 when it does not: ``*/*``
    0, ``type/*`` 1, a structured suffix's base type 2 (``application/json`` for
    ``application/problem+json``: its body is JSON), the type itself 3, plus one per
    parameter that matches."""
    if media_range.type == "*":
        level = 0
    elif media_range.type != offered.type:
        return -1
    elif media_range.subtype == "*":
        level = 1
    elif media_range.subtype == offered.subtype:
        level = 3
    elif offered.suffix is not None and media_range.subtype == offered.suffix:
        level = 2
    else:
        return -1
    if not _params_match(media_range.params, offered):
        return -1
    return level + len(media_range.params)


def preference(ranges: Sequence[MediaRange], offered: MediaType) -> tuple[float, int]:
    """``(q, specificity)`` of the most specific range that matches ``offered`` (the
    highest q among equally specific ones); ``(0.0, -1)`` when none matches. Of two types
    with the same q, the one a client named is preferred to one it reaches by a wildcard."""
    best, q = -1, 0.0
    for media_range in ranges:
        level = specificity(media_range.media, offered)
        if level > best:
            best, q = level, media_range.q
        elif level == best and level >= 0:
            q = max(q, media_range.q)
    return q, best


def quality(ranges: Sequence[MediaRange], offered: MediaType) -> float:
    """The q the most specific matching range gives ``offered`` (the highest among
    equally specific ones), 0 when none matches."""
    return preference(ranges, offered)[0]


def accepts(header: str | None, content_type: str) -> bool:
    """Whether an ``Accept`` header accepts ``content_type``. No header, or one without
    a single well-formed media range, accepts anything (RFC 9110: no preference)."""
    parsed = parse_media_type(content_type)
    if parsed is None:
        return True  # not a media type: nothing to compare (the view sent it as it is)
    ranges = parse_accept(header) if header is not None else []
    if not ranges:
        return True
    return quality(ranges, parsed[0]) > 0.0


# -- Django REST framework's URL format override --------------------------------------------


def _drf_view(request: HttpRequest) -> Any:
    """The DRF view answering ``request`` when it is DRF's ``Request``, else None. DRF is
    not imported for this: a request can only be DRF's when DRF is loaded."""
    module = sys.modules.get("rest_framework.request")
    if module is None or not isinstance(request, module.Request):
        return None
    return (getattr(request, "parser_context", None) or {}).get("view")


def format_parameter(request: HttpRequest) -> str | None:
    """The name of DRF's URL format override (``URL_FORMAT_OVERRIDE``, ``format`` by
    default) when ``request`` is answered by a DRF view, else None. For such a request
    the parameter chooses the representation, not what is done: it is left out of the
    fingerprint and weighed as the retry's ``Accept``."""
    view = _drf_view(request)
    if view is None:
        return None
    negotiator = view.get_content_negotiator() if hasattr(view, "get_content_negotiator") else None
    settings = getattr(negotiator, "settings", None)
    if settings is None:
        from rest_framework.settings import api_settings

        settings = api_settings
    name = getattr(settings, "URL_FORMAT_OVERRIDE", None)
    return str(name) if name else None


def format_media_types(request: HttpRequest) -> list[str] | None:
    """The media types of the view's renderers for the ``?format=`` the request names
    (DRF renders nothing else for it), or None when it names none."""
    if not request.META.get("QUERY_STRING"):
        return None  # no query: no format named (and no view to ask)
    name = format_parameter(request)
    if name is None:
        return None
    value = request.GET.get(name) if hasattr(request, "GET") else None
    if not value:
        return None
    view = _drf_view(request)
    return [str(r.media_type) for r in view.get_renderers() if r.format == value]


def retry_accepts(request: HttpRequest, content_type: str | None) -> bool:
    """Whether the retry ``request`` accepts a stored response of ``content_type`` (None:
    the response has no body's media type, a 204 say, which every retry accepts)."""
    if content_type is None:
        return True
    if not accepts(header_value(request, "Accept"), content_type):
        return False
    formats = format_media_types(request)
    if formats is None:
        return True
    return any(accepts(media_type, content_type) for media_type in formats)
