"""Storing and replaying responses, and RFC 9457 problem details."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from .conf import conf
from .errors import IdempotencyError

PROBLEM_CONTENT_TYPE = "application/problem+json"
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


def capture(response: HttpResponseBase) -> StoredResponse:
    """Snapshot a rendered response for storage, or raise NotStorable."""
    if getattr(response, "streaming", False):
        raise NotStorable("streaming response")
    render = getattr(response, "render", None)
    if render is not None and not getattr(response, "is_rendered", True):
        render()
    body = bytes(getattr(response, "content", b""))
    if len(body) > conf.MAX_STORED_BODY_SIZE:
        raise NotStorable("body larger than MAX_STORED_BODY_SIZE")
    headers = filter_headers(response.items(), conf.STORED_HEADERS, conf.NEVER_STORED_HEADERS)
    return StoredResponse(status=response.status_code, headers=headers, body=body)


def problem_response(
    error: IdempotencyError,
    *,
    extra: Mapping[str, object] | None = None,
    request: HttpRequest | None = None,
) -> HttpResponse:
    """The response for ``error``: ``IDEMPOTENCY["PROBLEM_RENDERER"]``'s when set (called
    as ``renderer(error, request)``), else :func:`problem_json`'s. Every entry point of the
    app passes the request it answers (DRF's ``Request`` on DRF views, Django's
    ``HttpRequest`` on the others); ``request`` is None only when a caller has none."""
    path = conf.PROBLEM_RENDERER
    if path:
        renderer = import_string(path)
        response: HttpResponse = renderer(error, request)
        return response
    return problem_json(error, extra=extra)


def problem_json(
    error: IdempotencyError, *, extra: Mapping[str, object] | None = None
) -> HttpResponse:
    """An RFC 9457 ``application/problem+json`` response for ``error`` (with its
    ``Retry-After``)."""
    payload: dict[str, object] = {
        "type": error.type_uri,
        "title": error.title,
        "status": error.status,
        "detail": error.detail,
    }
    if error.extra:
        payload.update(error.extra)
    if extra:
        payload.update(extra)
    response = HttpResponse(
        json.dumps(payload), status=error.status, content_type=PROBLEM_CONTENT_TYPE
    )
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    return response
