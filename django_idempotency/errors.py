"""Every error this app answers with, one class each.

Each carries its HTTP status and an RFC 9457 problem type; ``responses.problem_response``
turns one into an ``application/problem+json`` response.
"""

from __future__ import annotations

PROBLEM_BASE = "https://django-idempotency.readthedocs.io/en/latest/problems/"


class IdempotencyError(Exception):
    """Base class. Subclasses set ``status``, ``slug`` and ``title``."""

    status: int = 400
    slug: str = "idempotency-error"
    title: str = "Idempotency error"
    default_detail: str = "The request could not be processed."

    #: Extension members of the problem document (RFC 9457 section 3.2).
    extra: dict[str, object] | None = None

    def __init__(self, detail: str | None = None, *, retry_after: int | None = None) -> None:
        self.detail = detail or self.default_detail
        self.retry_after = retry_after
        super().__init__(self.detail)

    @property
    def type_uri(self) -> str:
        return PROBLEM_BASE + self.slug


class MissingKey(IdempotencyError):
    status = 400
    slug = "missing-key"
    title = "Idempotency-Key header required"
    default_detail = "This endpoint requires an Idempotency-Key header."


class InvalidKey(IdempotencyError):
    status = 400
    slug = "invalid-key"
    title = "Invalid Idempotency-Key"
    default_detail = "The Idempotency-Key must be 1 to 255 visible ASCII characters."


class InvalidBody(IdempotencyError):
    status = 400
    slug = "invalid-body"
    title = "Unreadable request body"
    default_detail = (
        "The request body could not be parsed (a malformed multipart body, or too many "
        "fields or files), so it cannot be fingerprinted."
    )


class RequestTooLarge(IdempotencyError):
    status = 413
    slug = "request-too-large"
    title = "Request body too large"
    default_detail = "The request body is larger than this server accepts."


class RequestInProgress(IdempotencyError):
    status = 409
    slug = "request-in-progress"
    title = "A request with this Idempotency-Key is in progress"
    default_detail = (
        "A request with the same Idempotency-Key is still being processed. "
        "Retry after the interval given in Retry-After."
    )


class LeaseLost(IdempotencyError):
    """The claim was taken over before this request could complete it.

    Everything the view wrote in its transaction has been rolled back.
    """

    status = 409
    slug = "lease-lost"
    title = "Idempotency-Key claim lost"
    default_detail = (
        "Another request took over this Idempotency-Key before this one finished; "
        "this request's changes were rolled back. Retry to receive the stored result."
    )


class FingerprintMismatch(IdempotencyError):
    status = 422
    slug = "key-reused"
    title = "Idempotency-Key reused with a different request"
    default_detail = (
        "This Idempotency-Key was already used with a different request "
        "(method, path, query or body). Use a new key for a new request."
    )


class ResponseNotStored(IdempotencyError):
    """The key's request completed, but its response was not kept (streamed, a file, or
    larger than ``MAX_STORED_BODY_SIZE``), so it cannot be replayed. The problem
    document carries the original status as ``original_status``."""

    status = 409
    slug = "response-not-stored"
    title = "The response to this Idempotency-Key was not stored"
    default_detail = (
        "The request with this Idempotency-Key has completed, but its response was not "
        "stored, so it cannot be sent again. Do not repeat the request: look its result up."
    )

    def __init__(self, original_status: int | None = None) -> None:
        if original_status is None:
            super().__init__()
            return
        super().__init__(
            f"The request with this Idempotency-Key has completed with status "
            f"{original_status}, but its response was not stored (streamed, a file, or too "
            "large), so it cannot be sent again. Do not repeat the request: look its result up."
        )
        self.extra = {"original_status": original_status}


class StoreUnavailable(IdempotencyError):
    status = 503
    slug = "store-unavailable"
    title = "Idempotency store unavailable"
    default_detail = (
        "The idempotency store cannot be reached, so the request was not processed. "
        "Retry with the same Idempotency-Key."
    )


class TransientConflict(IdempotencyError):
    """The view's transaction hit a conflict that a retry gets past (SQLite's busy
    snapshot, a PostgreSQL serialization failure, deadlock or lock timeout). Its
    writes were rolled back and the key released."""

    status = 503
    slug = "transient-conflict"
    title = "Temporary database conflict"
    default_detail = (
        "The request collided with a concurrent one in the database and was rolled back; "
        "nothing was stored. Retry with the same Idempotency-Key."
    )


class ImproperlyConfiguredStrategy(Exception):
    """The configured strategy cannot be loaded (reported by the system checks too)."""
