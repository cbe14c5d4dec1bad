"""The stored response: what is kept of a view's answer (status, allowed headers, body)
and how it is answered again. ``protocol.replay`` captures it from a response."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from django.http import HttpResponse

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
