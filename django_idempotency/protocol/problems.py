"""RFC 9457 problem details: the response for every ``errors.IdempotencyError``,
``application/problem+json`` or ``IDEMPOTENCY["PROBLEM_RENDERER"]``'s. The title and the
detail are translated here, into the language active when the answer is rendered."""

from __future__ import annotations

import json
from collections.abc import Mapping

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from ..conf import conf
from ..errors import IdempotencyError

PROBLEM_CONTENT_TYPE = "application/problem+json"


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


def problem_document(
    error: IdempotencyError, *, extra: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The members of ``error``'s problem document: ``type``, ``title``, ``status``,
    ``detail`` and its extension members."""
    payload: dict[str, object] = {
        "type": error.type_uri,
        "title": str(error.title),
        "status": error.status,
        "detail": str(error.detail),
    }
    if error.extra:
        payload.update(error.extra)
    if extra:
        payload.update(extra)
    return payload


def problem_json(
    error: IdempotencyError, *, extra: Mapping[str, object] | None = None
) -> HttpResponse:
    """An RFC 9457 ``application/problem+json`` response for ``error`` (with its
    ``Retry-After``), in UTF-8 as JSON is (RFC 8259) and as DRF writes its own errors: a
    translated ``detail`` reads "für", not "f\\u00fcr"."""
    payload = problem_document(error, extra=extra)
    response = HttpResponse(
        json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False).encode(),
        status=error.status,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    return response
