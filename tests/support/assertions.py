"""Checks of problem documents (RFC 9457, ``application/problem+json``)."""

from __future__ import annotations

import json
from typing import Any

from django_idempotency.protocol.problems import PROBLEM_CONTENT_TYPE


def assert_problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    """``response`` is a problem document of ``status`` whose type ends in ``/slug``,
    with a title and a detail; returns it."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM_CONTENT_TYPE
    payload = json.loads(response.content)
    assert {"type", "title", "status", "detail"} <= set(payload)
    assert payload["status"] == status
    assert payload["type"].endswith("/" + slug)
    assert payload["title"] and payload["detail"]
    return payload


def problem_slug(response: Any) -> str | None:
    """The slug of a problem response's type, else None."""
    if response.headers.get("Content-Type") != PROBLEM_CONTENT_TYPE:
        return None
    return str(json.loads(response.content)["type"]).rstrip("/").rsplit("/", 1)[-1]
