"""Every error this app answers with, one class each.

Each carries its HTTP status and an RFC 9457 problem type; ``protocol.problems.problem_response``
turns one into an ``application/problem+json`` response. The ``title`` and the ``detail`` are
lazy translations (``gettext_lazy``): they are in the language active when the problem is
rendered, the request's with ``LocaleMiddleware``; ``str()`` turns one into text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from .conf import DEFAULTS, conf

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: The default of ``IDEMPOTENCY["PROBLEM_BASE_URI"]``: this documentation's problem pages.
PROBLEM_BASE = str(DEFAULTS["PROBLEM_BASE_URI"])


class IdempotencyError(Exception):
    """Base class. Subclasses set ``status``, ``slug`` and ``title``."""

    status: int = 400
    slug: str = "idempotency-error"
    title: StrOrPromise = _("Idempotency error")
    default_detail: StrOrPromise = _("The request could not be processed.")

    #: Extension members of the problem document (RFC 9457 section 3.2).
    extra: dict[str, object] | None = None

    def __init__(
        self, detail: StrOrPromise | None = None, *, retry_after: int | None = None
    ) -> None:
        # Not ``detail or``: that would translate a lazy detail now, not when it is rendered.
        if detail is None or (isinstance(detail, str) and not detail):
            detail = self.default_detail
        self.detail: StrOrPromise = detail
        self.retry_after = retry_after
        super().__init__(self.detail)

    @property
    def type_uri(self) -> str:
        """``IDEMPOTENCY["PROBLEM_BASE_URI"]`` followed by the slug."""
        from django.conf import settings  # not a module attribute: the docs inspect this one

        base = conf.PROBLEM_BASE_URI if settings.configured else PROBLEM_BASE
        return base + self.slug


class MissingKey(IdempotencyError):
    """The view requires an ``Idempotency-Key`` (``REQUIRED``, ``idempotency_required``
    or ``@idempotent(required=True)``), the method is one of ``METHODS``, and the request
    sent none. The view did not run and nothing was stored. Send the request again with a
    fresh random key (a UUID v4) for this operation, and reuse that key on every retry."""

    status = 400
    slug = "missing-key"
    title = _("Idempotency-Key header required")
    default_detail = _("This endpoint requires an Idempotency-Key header.")


class InvalidKey(IdempotencyError):
    """The ``Idempotency-Key`` header is present but is not one key: empty, longer than 255
    characters, with spaces, control or non-ASCII characters, a list (``k1,k2``, or two
    header lines), or a malformed quoted (structured-field) value; ``detail`` says which.
    The view did not run. Fix the header (a UUID v4 is always valid) and send the request
    again; a retry with the same bad header gets the same answer."""

    status = 400
    slug = "invalid-key"
    title = _("Invalid Idempotency-Key")
    default_detail = _("The Idempotency-Key must be 1 to 255 visible ASCII characters.")


class InvalidBody(IdempotencyError):
    """The request carries a key, but its body cannot be parsed (a malformed multipart
    body, or more fields or files than the server accepts), so it cannot be fingerprinted
    and the key is not claimed. The view did not run. Fix the body and send the request
    again, with the same key: nothing was stored under it."""

    status = 400
    slug = "invalid-body"
    title = _("Unreadable request body")
    default_detail = _(
        "The request body could not be parsed (a malformed multipart body, or too many "
        "fields or files), so it cannot be fingerprinted."
    )


class IncompleteBody(IdempotencyError):
    """The request carries a key, but its body ended before the length its
    ``Content-Length`` header announced: the client closed the connection while sending it
    (a WSGI server such as gunicorn hands the part it received over without an error). A
    part of a request is not the request: the key is not claimed and the view did not run.
    Send the whole request again with the same key: it runs then, once."""

    status = 400
    slug = "incomplete-body"
    title = _("Incomplete request body")
    default_detail = _(
        "The request body is shorter than its Content-Length header announced, so the "
        "request was not processed. Send the whole request again with the same "
        "Idempotency-Key."
    )

    def __init__(
        self,
        detail: StrOrPromise | None = None,
        *,
        retry_after: int | None = None,
        received: int | None = None,
        announced: int | None = None,
    ) -> None:
        if detail is None and received is not None and announced is not None:
            detail = format_lazy(
                _(
                    "The request body ended after {received} of the {announced} bytes its "
                    "Content-Length header announced, so the request was not processed. Send "
                    "the whole request again with the same Idempotency-Key."
                ),
                received=received,
                announced=announced,
            )
        super().__init__(detail, retry_after=retry_after)


class CredentialsNotAuthenticated(IdempotencyError):
    """The request carries credentials (an ``Authorization`` header, or another of
    ``CREDENTIAL_HEADERS``) but its user was still anonymous when the key was claimed:
    the credentials were never checked (the key is claimed before the view authenticates,
    as ``@idempotent`` outside DRF's ``@api_view`` does) or no authentication the view
    uses accepts them. Scoping such a request as ``anonymous`` would share its stored
    responses with every other caller, so it is refused before the view runs. Send the
    request with valid credentials; a client whose credentials are valid has found a
    server bug, and nothing ran, so the same key is safe to retry once it is fixed."""

    status = 400
    slug = "credentials-not-authenticated"
    title = _("Credentials were not authenticated")
    default_detail = _(
        "The request carries credentials, but they were not authenticated before the "
        "Idempotency-Key was claimed, so the request was not processed."
    )


class RequestTooLarge(IdempotencyError):
    """The request carries a key and its body is larger than the server reads into memory
    (Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``, 2.5 MB by default), so it cannot be
    fingerprinted and the key is not claimed. The view did not run. Send a smaller body
    (or ask the server's operator for a larger limit); a retry as it is fails the same way."""

    status = 413
    slug = "request-too-large"
    title = _("Request body too large")
    default_detail = _("The request body is larger than this server accepts.")


class RequestInProgress(IdempotencyError):
    """Another request with the same key and the same fingerprint holds the key and has
    not finished. This one did not run. Retry with the same key after the ``Retry-After``
    header's interval (``RETRY_AFTER``, 1 second by default): once the first request has
    finished, the retry receives its stored response. Do not switch to a new key: that
    would run the operation a second time."""

    status = 409
    slug = "request-in-progress"
    title = _("A request with this Idempotency-Key is in progress")
    default_detail = _(
        "A request with the same Idempotency-Key is still being processed. "
        "Retry after the interval given in Retry-After."
    )


class LeaseLost(IdempotencyError):
    """This request's claim was taken over before it could complete it (its lease was
    not renewed for ``LOCK_TIMEOUT``, and another request took the key). Everything the
    view wrote in its transaction has been rolled back. Retry with the same key: the retry
    receives the response of the request that took over, or a 409 request-in-progress
    while that one still runs."""

    status = 409
    slug = "lease-lost"
    title = _("Idempotency-Key claim lost")
    default_detail = _(
        "Another request took over this Idempotency-Key before this one finished; "
        "this request's changes were rolled back. Retry to receive the stored result."
    )


class RemoteOutcomeUnknown(IdempotencyError):
    """A remote step of this request was called by an earlier attempt that ended before its
    result was recorded, and the key's first claim is older than the other service keeps
    its idempotency keys (``DOWNSTREAM_KEY_LIFETIME``): called again, the call could take
    effect a second time, so it is not made. Whether the first call took effect is unknown;
    the key is kept in progress, with its steps, for someone to reconcile (look the
    downstream key up at the other service). Do not retry under a new key."""

    status = 409
    slug = "remote-outcome-unknown"
    title = _("Outcome of an earlier call to another service unknown")
    default_detail = _(
        "An earlier attempt of this request called another service too long ago for that "
        "service to recognise the call again, and its result was not recorded; the call is "
        "not repeated. The request needs to be reconciled; do not retry it with a new key."
    )


class FingerprintMismatch(IdempotencyError):
    """The key was already used in this scope for a different request: another method,
    path, query string or body (compared canonically, so JSON key order and whitespace do
    not matter). This request did not run. It is a client bug: one key was given to two
    operations, and one of them has already happened. Do not retry it as it is; use a new
    key for a new operation, and check first whether the operation is the one that ran."""

    status = 422
    slug = "key-reused"
    title = _("Idempotency-Key reused with a different request")
    default_detail = _(
        "This Idempotency-Key was already used with a different request "
        "(method, path, query or body). Use a new key for a new request."
    )


class ResponseNotStored(IdempotencyError):
    """The key's request completed, but its response was not kept (streamed, a file, or
    larger than ``MAX_STORED_BODY_SIZE``), so it cannot be replayed. The problem
    document carries the original status as ``original_status``. Do not send the request
    again, with this key or a new one: it has happened. Look its result up instead (the
    resource it created, or the ``Location`` the first response gave)."""

    status = 409
    slug = "response-not-stored"
    title = _("The response to this Idempotency-Key was not stored")
    default_detail = _(
        "The request with this Idempotency-Key has completed, but its response was not "
        "stored, so it cannot be sent again. Do not repeat the request: look its result up."
    )

    def __init__(
        self,
        detail: StrOrPromise | None = None,
        *,
        retry_after: int | None = None,
        original_status: int | None = None,
    ) -> None:
        if detail is None and original_status is not None:
            detail = format_lazy(
                _(
                    "The request with this Idempotency-Key has completed with status "
                    "{status}, but its response was not stored (streamed, a file, or too "
                    "large), so it cannot be sent again. Do not repeat the request: look its "
                    "result up."
                ),
                status=original_status,
            )
        super().__init__(detail, retry_after=retry_after)
        if original_status is not None:
            self.extra = {"original_status": original_status}


class ReplayNotAcceptable(IdempotencyError):
    """The key's request has completed, but its stored response is in a media type this
    retry does not accept (its ``Accept`` header, or DRF's ``?format=``): the first request
    asked for HTML (DRF's browsable API), say, and the retry for JSON. A replay is the
    response of the execution that committed and is never rendered again, so the retry is
    told this instead of being handed a body it cannot parse. The problem document carries
    ``original_status`` and ``original_content_type``.

    The client must not repeat the request under a new key (it has been carried out):
    retry with this key and an ``Accept`` (or ``?format=``) that includes
    ``original_content_type``, or look the result up."""

    status = 406
    slug = "replay-not-acceptable"
    title = _("The stored response is not in a media type this request accepts")
    default_detail = _(
        "The request with this Idempotency-Key has completed, but its stored response is "
        "in a media type this request does not accept. Do not repeat the request under a "
        "new key: retry with this key accepting that media type, or look the result up."
    )

    def __init__(
        self,
        detail: StrOrPromise | None = None,
        *,
        retry_after: int | None = None,
        original_status: int | None = None,
        original_content_type: str | None = None,
    ) -> None:
        if detail is None and original_status is not None and original_content_type:
            detail = format_lazy(
                _(
                    "The request with this Idempotency-Key has completed with status "
                    "{status}; its stored response is {media_type}, which this request's "
                    "Accept header (or format) does not accept. Do not repeat the request "
                    "under a new key: retry with this key accepting {media_type}, or look "
                    "the result up."
                ),
                status=original_status,
                media_type=original_content_type,
            )
        super().__init__(detail, retry_after=retry_after)
        extra: dict[str, object] = {}
        if original_status is not None:
            extra["original_status"] = original_status
        if original_content_type:
            extra["original_content_type"] = original_content_type
        self.extra = extra or None


class StoreUnavailable(IdempotencyError):
    """The idempotency store could not be reached (the database failed during the claim
    or the completion, or Redis with ``REDIS_FAILURE_MODE = "fail_closed"``), so the view
    did not run or its writes were rolled back: nothing happened and nothing was stored.
    Retry later with the same key, with backoff (and after ``Retry-After`` when the answer
    carries one)."""

    status = 503
    slug = "store-unavailable"
    title = _("Idempotency store unavailable")
    default_detail = _(
        "The idempotency store cannot be reached, so the request was not processed. "
        "Retry with the same Idempotency-Key."
    )


class TransientConflict(IdempotencyError):
    """The view's transaction hit a conflict that a retry gets past (SQLite's busy
    snapshot, a PostgreSQL serialization failure, a deadlock or lock timeout on
    PostgreSQL, MariaDB or MySQL), or the claim itself kept hitting one. The view's
    writes were rolled back and the key released (or never claimed), so nothing happened
    and nothing was stored. Retry with the same key after the ``Retry-After`` interval."""

    status = 503
    slug = "transient-conflict"
    title = _("Temporary database conflict")
    default_detail = _(
        "The request collided with a concurrent one in the database and was rolled back; "
        "nothing was stored. Retry with the same Idempotency-Key."
    )


class DatabaseUnavailable(IdempotencyError):
    """The view's database connection was lost (the server restarted, an administrator
    or a proxy closed it). The database rolled the view's transaction back and the key
    was released, or, when the database could not be reached for that either, is taken
    over once its lease is stale. Should the connection have been lost while the
    transaction committed, the response was stored with it and a retry replays it.
    Retry with the same key after the ``Retry-After`` interval: a request that was rolled
    back runs again, one that committed is replayed."""

    status = 503
    slug = "database-unavailable"
    title = _("Database connection lost")
    default_detail = _(
        "The connection to the database was lost while the request was processed. "
        "Retry with the same Idempotency-Key: a request whose changes were rolled back "
        "runs again, one that was committed is replayed."
    )


class DatabaseMisconfigured(IdempotencyError):
    """The view tried to write to a database other than the one that holds its key
    (``IDEMPOTENCY["DATABASE"]``, or its shard's) and not declared in
    ``UNPROTECTED_DATABASES``: a write there would commit outside the transaction that
    stores the key's response, so a failed request would leave it behind for the retry to
    repeat, or a response would be stored for a write that never commits. The write was
    refused before it ran, the view's transaction rolled back and the key released;
    nothing was stored. Also raised before any claim when the database chosen for the
    key (``DATABASE_ROUTING``) is not one of ``KEY_DATABASES``. The server's
    configuration needs fixing (its log names the database and the statement): the
    client retries later with the same key, which then runs the request once."""

    status = 503
    slug = "database-misconfigured"
    title = _("Server database configuration error")
    default_detail = _(
        "This server's database configuration does not let the request's changes be made "
        "safely under its Idempotency-Key, so the request was refused: nothing was changed "
        "or stored. Retry later with the same Idempotency-Key."
    )


# -- configuration errors: Django's ImproperlyConfigured, so code that catches that catches
# these too ----------------------------------------------------------------------------------


class InvalidConfiguration(ImproperlyConfigured):
    """A setting, or a view's option, that the system checks call an error: raised at
    start-up (``AppConfig.ready()``, in every process that calls ``django.setup()``), on
    first use after a setting changed, and where a view declares its options, so that no
    request is ever served under it. The message is the checks' own:
    ``"<check id>: <message> HINT: <hint>"``, one line per error."""


#: The hint of check E006 (a strategy that cannot be loaded).
STRATEGY_HINT = (
    "Use 'db', 'advisory_lock', 'redis', 'hybrid' or the dotted path of a Strategy subclass "
    "(the redis and hybrid strategies need `pip install django-idempotency[redis]`)."
)


class ImproperlyConfiguredStrategy(InvalidConfiguration):
    """The configured strategy cannot be loaded: check E006, with the check's message."""

    def __init__(self, reason: str) -> None:
        #: What the check says (its message; the hint is :data:`STRATEGY_HINT`).
        self.reason = reason
        super().__init__(f"django_idempotency.E006: {reason} HINT: {STRATEGY_HINT}")


class MisplacedIdempotencyMixin(ImproperlyConfigured):
    """``IdempotencyMixin`` comes after ``APIView`` in a view's bases (or is used on a
    view that is not a DRF ``APIView``), where its ``dispatch()`` and ``initial()``
    never run and the view would have no protection. Raised when the class is created."""


class RedisNotConfigured(ImproperlyConfigured):
    """The redis or hybrid strategy is used without ``REDIS_URL`` or ``REDIS_CACHE_ALIAS``."""
