"""The stored response: what is kept of a view's answer (:func:`capture`, with the header
allow-list and the headers ``LocaleMiddleware`` adds later) and how it is replayed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils import translation
from django.utils.module_loading import import_string

from ..conf import conf

REPLAYED_HEADER = "Idempotent-Replayed"
#: A pseudo-header (no HTTP field name holds a colon) marking a record whose response was
#: not kept (streamed, a file, or over ``MAX_STORED_BODY_SIZE``); its value says why.
NOT_STORED = ":not-stored"


@dataclass(frozen=True)
class StoredResponse:
    """What is kept of a response: status, allowed headers, body bytes."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def from_row(
        cls,
        status: int | None,
        headers: Mapping[str, str] | None,
        body: bytes | memoryview | None,
    ) -> StoredResponse:
        """The response kept in a database row's ``response_status``, ``response_headers``
        and ``response_body`` columns (of IdempotencyKey or of the outbox)."""
        return cls(status=int(status or 0), headers=dict(headers or {}), body=bytes(body or b""))

    @classmethod
    def not_stored(cls, status: int, reason: str) -> StoredResponse:
        """The record of a response that completed the key but was not kept."""
        return cls(status=status, headers={NOT_STORED: reason})

    @property
    def replayable(self) -> bool:
        """False for the record of a response that was not kept."""
        return NOT_STORED not in self.headers

    @property
    def media_type(self) -> str | None:
        """The stored ``Content-Type`` of a body, None for a response without a body or
        without a ``Content-Type`` (a 204): a replay of it hands no representation to
        parse."""
        if not self.body:
            return None
        for name, value in self.headers.items():
            if name.lower() == "content-type":
                return value
        return None

    def to_http(self) -> HttpResponse:
        response = HttpResponse(self.body, status=self.status)
        if "Content-Type" not in self.headers:
            del response["Content-Type"]
        for name, value in self.headers.items():
            response[name] = value
        response[REPLAYED_HEADER] = "true"
        return response


class NotStorable(Exception):
    """The response cannot be stored (streaming or too large): the key is completed
    with a :meth:`StoredResponse.not_stored` record instead."""


def filter_headers(
    items: Iterable[tuple[str, str]],
    allowed: frozenset[str],
    denied: frozenset[str],
) -> dict[str, str]:
    """Keep the allow-listed headers, never the denied ones (case-insensitive), and never
    a pseudo-header (a name starting with a colon, such as :data:`NOT_STORED`)."""
    kept: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in allowed and lower not in denied and not lower.startswith(":"):
            kept[name] = value
    return kept


def _locale_middleware_installed() -> bool:
    """Whether ``MIDDLEWARE`` holds Django's ``LocaleMiddleware`` (or a subclass). It sets
    ``Content-Language`` with ``USE_I18N = False`` too (to ``LANGUAGE_CODE``)."""
    return _holds_locale_middleware(tuple(getattr(settings, "MIDDLEWARE", None) or ()))


@lru_cache(maxsize=8)
def _holds_locale_middleware(middleware: tuple[str, ...]) -> bool:
    """``_locale_middleware_installed()`` for one ``MIDDLEWARE`` list, imported once."""
    from django.middleware.locale import LocaleMiddleware

    for path in middleware:
        try:
            middleware = import_string(path)
        except ImportError:
            continue  # Django reports it when it loads the middleware
        if isinstance(middleware, type) and issubclass(middleware, LocaleMiddleware):
            return True
    return False


def locale_headers(request: HttpRequest | None, response: HttpResponseBase) -> dict[str, str]:
    """What ``LocaleMiddleware.process_response`` will add to ``response`` after it has
    been captured (the view and the app run before it): ``Content-Language`` (the language
    active now, the one the response was produced in) unless the response has one, and
    ``Accept-Language`` in ``Vary`` unless the language comes from an ``i18n_patterns``
    URL prefix. A replay keeps them, so LocaleMiddleware cannot label a replayed German
    body with the retry's language. Empty without LocaleMiddleware or a request."""
    if request is None or not _locale_middleware_installed():
        return {}
    from django.conf.urls.i18n import is_language_prefix_patterns_used

    added: dict[str, str] = {}
    path_info = getattr(request, "path_info", request.path)
    urlconf = getattr(request, "urlconf", settings.ROOT_URLCONF)
    from_path = translation.get_language_from_path(path_info)
    if not (is_language_prefix_patterns_used(urlconf)[0] and from_path):
        vary = [v.strip() for v in response.get("Vary", "").split(",") if v.strip()]
        if not any(v.lower() in ("accept-language", "*") for v in vary):
            added["Vary"] = ", ".join([*vary, "Accept-Language"])
    language = translation.get_language()
    if "Content-Language" not in response and language:
        added["Content-Language"] = language
    return added


def capture(response: HttpResponseBase, request: HttpRequest | None = None) -> StoredResponse:
    """Snapshot a rendered response for storage, or raise NotStorable. With ``request``,
    the headers ``LocaleMiddleware`` adds later are stored too (:func:`locale_headers`)."""
    if getattr(response, "streaming", False):
        raise NotStorable("streaming response")
    render = getattr(response, "render", None)
    if render is not None and not getattr(response, "is_rendered", True):
        render()
    body = bytes(getattr(response, "content", b""))
    if len(body) > conf.MAX_STORED_BODY_SIZE:
        raise NotStorable("body larger than MAX_STORED_BODY_SIZE")
    added = locale_headers(request, response)
    items: Iterable[tuple[str, str]] = response.items()
    if added:
        replaced = {name.lower() for name in added}
        items = [(n, v) for n, v in items if n.lower() not in replaced]
        items.extend(added.items())
    headers = filter_headers(items, conf.STORED_HEADERS, conf.NEVER_STORED_HEADERS)
    return StoredResponse(status=response.status_code, headers=headers, body=body)
