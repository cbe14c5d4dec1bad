"""The protocol, in one place.

    header -> key -> scope -> fingerprint -> strategy.session -> view -> store or release

The DRF mixin and the function-view decorator are thin adapters over
:class:`IdempotentRequest`; neither knows about SQL or Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from django.db import DatabaseError, InterfaceError, connections
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from . import signals
from .conf import conf
from .errors import (
    DATABASE_ERRORS,
    FingerprintMismatch,
    IdempotencyError,
    LeaseLost,
    MissingKey,
    RequestInProgress,
    ResponseNotStored,
    TransientConflict,
    classify_database_error,
)
from .keys import bounded_scope, downstream_key, fingerprint, parse_key
from .lease import keeper
from .responses import NotStorable, StoredResponse, capture, problem_response
from .strategies import get_strategy
from .strategies.base import Attempt, Claimed, InFlight, Mismatch, Outcome, Replay, Strategy

logger = logging.getLogger("django_idempotency")

#: ``(strategy name, outcome, seconds)``, called after each claim when set
#: (``django_idempotency.metrics`` sets it). None keeps the claim path free of timing.
ClaimTimer = Callable[[str, str, float], None]
claim_timer: ClaimTimer | None = None


@dataclass(frozen=True, init=False)
class Options:
    """Per-view settings; ``None`` fields fall back to ``settings.IDEMPOTENCY``.

    ``methods`` is kept upper-cased, whatever case a view names them in.
    """

    methods: frozenset[str] | None
    required: bool | None
    ttl: float | None
    lock_timeout: float | None
    strategy: str | None

    def __init__(
        self,
        methods: Iterable[str] | None = None,
        required: bool | None = None,
        ttl: float | None = None,
        lock_timeout: float | None = None,
        strategy: str | None = None,
    ) -> None:
        # Frozen: the fields are set the way a dataclass's own __init__ sets them.
        upper = frozenset(m.upper() for m in methods) if methods is not None else None
        object.__setattr__(self, "methods", upper)
        object.__setattr__(self, "required", required)
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "lock_timeout", lock_timeout)
        object.__setattr__(self, "strategy", strategy)

    def applies_to(self, method: str | None) -> bool:
        methods = self.methods if self.methods is not None else conf.METHODS
        return (method or "").upper() in methods


@dataclass(frozen=True)
class RequestIdempotency:
    """What a view sees as ``request.idempotency``."""

    scope: str
    key: str
    fingerprint: str
    replayed: bool = False

    def downstream_key(self, name: str = "default") -> str:
        """A key for an outside service (e.g. a payment provider's Idempotency-Key),
        the same for every retry of this request."""
        return downstream_key(conf.DOWNSTREAM_KEY_SECRET, self.scope, self.key, name)


def default_scope(request: HttpRequest) -> str:
    """``user:<pk>`` for an authenticated user, else ``anonymous``."""
    path = conf.SCOPE_FUNCTION
    if path:
        func: Callable[[HttpRequest], str] = import_string(path)
        return str(func(request))
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return "anonymous"


class IdempotentRequest:
    """One request that carries an Idempotency-Key, from claim to stored response.

    Use as a context manager around the view::

        idem = IdempotentRequest.from_request(request, scope, options)
        with idem as outcome:
            if not idem.claimed:
                return idem.short_circuit()
            return idem.finish(view(request))

    ``IdempotencyError`` raised anywhere in this becomes a problem response
    through :func:`problem_response`.
    """

    def __init__(self, request: HttpRequest, key: str, scope: str, options: Options) -> None:
        self.request = request
        self.key = key
        self.scope = bounded_scope(scope)
        self.options = options
        self.strategy: Strategy = get_strategy(options.strategy)
        self.fingerprint = fingerprint(request)
        self.attempt = Attempt(
            scope=self.scope,
            key=key,
            fingerprint=self.fingerprint,
            ttl=options.ttl if options.ttl is not None else conf.TTL,
            lock_timeout=(
                options.lock_timeout if options.lock_timeout is not None else conf.LOCK_TIMEOUT
            ),
            method=(request.method or "").upper(),
            path=request.get_full_path()[:2048],
            atomic=conf.ATOMIC,
            database=conf.DATABASE,
        )
        self.outcome: Outcome | None = None
        self._session: Any = None
        self._lease_cm: Any = None

    # -- step 1 and 2: header -> key ---------------------------------------------------------

    @staticmethod
    def header_key(request: HttpRequest, options: Options) -> str | None:
        """The validated key, None when absent and optional; raises 400 errors."""
        raw = request.headers.get(conf.HEADER)
        if raw is None:
            required = options.required if options.required is not None else conf.REQUIRED
            if required:
                raise MissingKey(f"This endpoint requires an {conf.HEADER} header.")
            return None
        return parse_key(raw)

    @classmethod
    def from_request(
        cls, request: HttpRequest, scope: Callable[[HttpRequest], str], options: Options
    ) -> IdempotentRequest | None:
        """None when the request does not take part (method, or no key and not required)."""
        if not options.applies_to(request.method):
            return None
        key = cls.header_key(request, options)
        if key is None:
            return None
        return cls(request, key, scope(request), options)

    # -- step 3: claim -------------------------------------------------------------------------

    @property
    def claimed(self) -> bool:
        return isinstance(self.outcome, Claimed)

    def _send(self, signal: Any) -> None:
        signal.send(
            sender=type(self.strategy),
            request=self.request,
            scope=self.scope,
            key=self.key,
            strategy=self.strategy.name,
        )

    def __enter__(self) -> Outcome:
        self._session = self.strategy.session(self.attempt)
        timer = claim_timer
        outcome: Outcome
        if timer is None:
            outcome = self._session.__enter__()
        else:
            started = time.perf_counter()
            try:
                outcome = self._session.__enter__()
            except BaseException:
                timer(self.strategy.name, "error", time.perf_counter() - started)
                raise
        self.outcome = outcome
        try:
            if timer is not None:
                timer(self.strategy.name, outcome.label, time.perf_counter() - started)
            info = RequestIdempotency(self.scope, self.key, self.fingerprint)
            self.request.idempotency = info  # type: ignore[attr-defined]
            if isinstance(outcome, Claimed):
                self._send(signals.key_taken_over if outcome.taken_over else signals.key_claimed)
                log = logger.warning if outcome.taken_over else logger.debug
                log(
                    "idempotency key %s (scope %s) %s",
                    self.key,
                    self.scope,
                    "taken over from a stale lease" if outcome.taken_over else "claimed",
                    extra=self._log_extra("taken_over" if outcome.taken_over else "claimed"),
                )
                # Renew well within *this* request's lock timeout: a view may set a
                # shorter one than the global LOCK_TIMEOUT the default interval comes from.
                interval = min(conf.HEARTBEAT_INTERVAL, self.attempt.lock_timeout / 3)
                self._lease_cm = keeper.keep(outcome, interval)
                self._lease_cm.__enter__()
        except BaseException as exc:
            # ``with`` does not call __exit__ when __enter__ raises: end the session here
            # (roll back its transaction, release the key) instead of leaving it to the
            # garbage collector while the traceback, and the open transaction, live on.
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lease_cm is not None:
            self._lease_cm.__exit__(None, None, None)
            self._lease_cm = None
        session, self._session = self._session, None
        error = exc
        try:
            if session is not None:
                session.__exit__(exc_type, exc, tb)
        except BaseException as raised:
            error = raised
            raise
        finally:
            if error is not None and isinstance(self.outcome, Claimed):
                self._report_error(self.outcome, error)

    def _report_error(self, claim: Claimed, error: BaseException) -> None:
        if claim.committed:
            logger.error(
                "idempotency key %s (scope %s) completed; the error raised after COMMIT "
                "(an on_commit hook) leaves the stored response in place",
                self.key,
                self.scope,
                extra=self._log_extra("committed"),
            )
        elif isinstance(error, LeaseLost):
            self._send(signals.lease_lost)
            logger.warning(
                "idempotency key %s (scope %s): claim lost, the view's writes were rolled back",
                self.key,
                self.scope,
                extra=self._log_extra("lease_lost"),
            )
        else:
            self._send(signals.key_released)
            logger.info(
                "idempotency key %s (scope %s) released after an exception in the view",
                self.key,
                self.scope,
                extra=self._log_extra("released"),
            )

    # -- step 4: the answer ----------------------------------------------------------------

    def short_circuit(self) -> HttpResponse:
        """The response for an outcome other than Claimed."""
        outcome = self.outcome
        if isinstance(outcome, Replay):
            self._send(signals.response_replayed)
            logger.info(
                "idempotency key %s (scope %s) replayed",
                self.key,
                self.scope,
                extra=self._log_extra("replayed"),
            )
            if not outcome.response.replayable:
                raise ResponseNotStored(original_status=outcome.response.status)
            return outcome.response.to_http()
        if isinstance(outcome, Mismatch):
            self._send(signals.key_mismatch)
            logger.info(
                "idempotency key %s (scope %s) reused with a different request",
                self.key,
                self.scope,
                extra=self._log_extra("mismatch"),
            )
            raise FingerprintMismatch()
        if isinstance(outcome, InFlight):
            self._send(signals.request_conflict)
            logger.info(
                "idempotency key %s (scope %s) is in progress",
                self.key,
                self.scope,
                extra=self._log_extra("conflict"),
            )
            retry_after = conf.RETRY_AFTER
            raise RequestInProgress(
                retry_after=retry_after if retry_after is not None else outcome.retry_after
            )
        raise AssertionError(f"unexpected outcome {outcome!r}")

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store a storable response under the key, or release the key."""
        claim = self.outcome
        assert isinstance(claim, Claimed)
        if self._lease_cm is not None:
            self._lease_cm.__exit__(None, None, None)
            self._lease_cm = None
        if response.status_code >= 500 and not conf.STORE_SERVER_ERRORS:
            return self._release(claim, response, "a server error")
        try:
            stored = capture(response)
        except NotStorable as exc:
            # The view's writes commit all the same: the key is completed, and a retry is
            # told that the response was not kept instead of running the view again.
            stored = StoredResponse.not_stored(response.status_code, str(exc))
            logger.info(
                "idempotency key %s (scope %s) completed without its response: %s",
                self.key,
                self.scope,
                exc,
                extra=self._log_extra("not_stored"),
            )
        claim.complete(stored)
        self._send(signals.response_stored)
        return response

    def _release(self, claim: Claimed, response: HttpResponseBase, why: str) -> HttpResponseBase:
        claim.release()
        self._send(signals.key_released)
        logger.info(
            "idempotency key %s (scope %s) released: %s",
            self.key,
            self.scope,
            why,
            extra=self._log_extra("released"),
        )
        return response

    def _log_extra(self, outcome: str) -> dict[str, str]:
        return {
            "idempotency_scope": self.scope,
            "idempotency_key": self.key,
            "idempotency_outcome": outcome,
            "idempotency_strategy": self.strategy.name,
        }


def transient_conflict_response(exc: DatabaseError | InterfaceError) -> HttpResponse:
    """503 problem+json for a database error that a retry gets past: a transient conflict
    in the view's transaction, or a lost connection (``errors.classify_database_error``);
    other database errors propagate. By the time this runs the claim's session has rolled
    the view's writes back and released the key (unless the database could not be reached
    for that: the key is then taken over once its lease is stale)."""
    retry_after = conf.RETRY_AFTER
    error = classify_database_error(
        exc, connections[conf.DATABASE], retry_after=1 if retry_after is None else retry_after
    )
    if error is None:
        raise exc
    if isinstance(error, TransientConflict):
        logger.warning("idempotent request rolled back by a transient database conflict: %s", exc)
    else:
        logger.warning(
            "idempotent request rolled back, its database connection was lost: %s",
            exc,
            exc_info=exc,
        )
    return problem_response(error)


def handle(
    request: HttpRequest,
    view: Callable[[], HttpResponseBase],
    *,
    scope: Callable[[HttpRequest], str] = default_scope,
    options: Options | None = None,
) -> HttpResponseBase:
    """Run ``view`` under the Idempotency-Key protocol (the function-view path)."""
    options = options or Options()
    try:
        idem = IdempotentRequest.from_request(request, scope, options)
        if idem is None:
            return view()
        with idem:
            if not idem.claimed:
                return idem.short_circuit()
            return idem.finish(view())
    except IdempotencyError as error:
        return problem_response(error)
    except DATABASE_ERRORS as exc:
        return transient_conflict_response(exc)
