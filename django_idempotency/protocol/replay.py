"""What is kept of a view's answer: :func:`capture` makes the stored response (with the
header allow-list and the headers ``LocaleMiddleware`` adds later). The value itself,
``StoredResponse``, is in :mod:`django_idempotency.values.response`, which the store and the
strategies share; it is named here too."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils import translation
from django.utils.module_loading import import_string

from ..conf import conf
from ..values.response import NOT_STORED, REPLAYED_HEADER, StoredResponse

__all__ = [
    "NOT_STORED",
    "REPLAYED_HEADER",
    "NotStorable",
    "StoredResponse",
    "capture",
    "filter_headers",
    "locale_headers",
]


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
