"""Problems in DRF's browsable API (imports ``rest_framework``).

A client that asked a DRF view for HTML (the browsable API's forms, ``?format=api``) gets
this app's problem inside the page DRF renders, with the problem's status, members and
``Retry-After``; before, its form was answered with raw ``application/problem+json``, which
the browser showed in place of the page, or (from the page's AJAX form) dropped. Every other
client gets ``application/problem+json``, and a configured ``PROBLEM_RENDERER`` answers
everyone. Only problems are rendered so: a replay is the stored response as it was stored.

The page is rendered before the response leaves ``IdempotencyMixin.dispatch()``, after the
claim's lifecycle has ended, so that a page that cannot be built (its forms read the
database, which may be the very thing that failed) is answered ``problem+json`` instead of
a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http.response import HttpResponseBase
from django.utils.cache import patch_vary_headers
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from .conf import conf
from .errors import IdempotencyError
from .protocol.negotiation import (
    MediaType,
    format_parameter,
    parse_accept,
    parse_media_type,
    preference,
)
from .protocol.problems import problem_document, problem_json, problem_response

logger = logging.getLogger("django_idempotency")

HTML = MediaType("text", "html")
PROBLEM_JSON = MediaType("application", "problem+json")


class ProblemPage(Response):
    """A problem document for DRF's negotiated HTML renderer (the browsable API); the
    error is kept for the ``problem+json`` it falls back to."""

    def __init__(self, error: IdempotencyError) -> None:
        super().__init__(problem_document(error), status=error.status)
        self.error = error
        # DRF's template renderers show their error templates for an exception response.
        self.exception = True
        if error.retry_after is not None:
            self["Retry-After"] = str(error.retry_after)


def asks_for_html(request: Request) -> bool:
    """Whether DRF's content negotiation picked an HTML renderer for ``request`` because
    the client asked for HTML: by ``?format=`` (``api``), or by an ``Accept`` that prefers
    ``text/html`` to ``application/problem+json`` (a higher q, or the same q for
    ``text/html`` named and problem+json reached by a wildcard, as a browser's
    ``text/html,…,*/*;q=0.8`` and the browsable API's ``text/html; q=1.0, */*`` do). A
    client that sends no ``Accept``, or ``*/*``, is not asking for HTML, whatever renderer
    the view lists first."""
    renderer = getattr(request, "accepted_renderer", None)
    parsed = parse_media_type(str(getattr(renderer, "media_type", "") or ""))
    if parsed is None or (parsed[0].type, parsed[0].subtype) != ("text", "html"):
        return False
    name = format_parameter(request)
    if name and request.query_params.get(name):
        return True  # the format override chose the HTML renderer
    ranges = parse_accept(request.headers.get("Accept", ""))
    return preference(ranges, HTML) > preference(ranges, PROBLEM_JSON)


def drf_problem_response(error: IdempotencyError, request: Any) -> HttpResponseBase:
    """The answer of a DRF view for ``error``: ``PROBLEM_RENDERER``'s when one is set, a
    :class:`ProblemPage` for a client that asked for HTML, else ``problem+json``. It depends
    on ``Accept``, and says so (``Vary``)."""
    if conf.PROBLEM_RENDERER or not isinstance(request, Request) or not asks_for_html(request):
        response: HttpResponseBase = problem_response(error, request=request)
    else:
        response = ProblemPage(error)
    if not conf.PROBLEM_RENDERER:
        patch_vary_headers(response, ("Accept",))
    return response


_PAGE_RENDERERS: dict[type[BrowsableAPIRenderer], type[BrowsableAPIRenderer]] = {}


def problem_page_renderer(base: type[BrowsableAPIRenderer]) -> type[BrowsableAPIRenderer]:
    """``base`` (DRF's browsable renderer, or a project's subclass of it) naming
    ``application/problem+json`` in the page's response box, where DRF names the media
    type of the view's first renderer (``application/json``) whatever the response is;
    one class per base, made on first use."""
    if base in _PAGE_RENDERERS:
        return _PAGE_RENDERERS[base]

    def get_context(self: Any, data: Any, accepted_media_type: Any, context: Any) -> Any:
        page = base.get_context(self, data, accepted_media_type, context)
        page["response_headers"]["Content-Type"] = "application/problem+json"
        return page

    made = type(f"Problem{base.__name__}", (base,), {"get_context": get_context})
    return _PAGE_RENDERERS.setdefault(base, made)


def render_problem_page(response: HttpResponseBase, view: Any) -> HttpResponseBase:
    """Render a :class:`ProblemPage` now, finalized by ``view`` (DRF's ``APIView``) when it
    has not been yet; another response is returned as it is. A page that cannot be
    rendered (its forms need a database that failed, a template is missing) is answered
    ``problem+json``, with the headers the page had (``Allow``, ``Vary``), and logged."""
    if not isinstance(response, ProblemPage) or response.is_rendered:
        return response
    try:
        if getattr(response, "accepted_renderer", None) is None:
            view.finalize_response(view.request, response)
        renderer = response.accepted_renderer
        if isinstance(renderer, BrowsableAPIRenderer):
            response.accepted_renderer = problem_page_renderer(type(renderer))()
        response.render()
    except Exception as exc:  # the page is a convenience: never a 500 for it
        logger.warning(
            "could not render the %s problem as DRF's browsable API page, answering "
            "problem+json: %r",
            response.error.slug,
            exc,
            exc_info=exc,
        )
        fallback = problem_json(response.error)
        for name, value in response.items():
            if name.lower() not in ("content-type", "content-length"):
                fallback[name] = value
        return fallback
    return response
