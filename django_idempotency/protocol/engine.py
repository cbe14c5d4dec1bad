"""The protocol, in one place.

    header -> key -> scope -> fingerprint -> lifecycle (claim) -> view -> store or release

The DRF mixin and the function-view decorator are thin adapters over
:class:`IdempotentRequest`; neither knows about SQL or Redis. See docs/architecture.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import cast

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError, InterfaceError, connections
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from .. import signals
from ..conf import conf
from ..errors import (
    FingerprintMismatch,
    IdempotencyError,
    LeaseLost,
    MissingKey,
    ReplayNotAcceptable,
    RequestInProgress,
    ResponseNotStored,
    TransientConflict,
)
from ..store.errors import DATABASE_ERRORS, classify_database_error, retry_after
from ..strategies import get_strategy, waiting
from ..strategies.base import Attempt, Claim, InProgress, Mismatch, Outcome, Replay, Strategy
from ..strategies.stepped import StepClaim, steps_strategy
from .fingerprint import fingerprint
from .header import header_value
from .keys import downstream_key, key_digest
from .keysource import KeyFunc, may_carry_body_key, missing_detail, request_key
from .lease import Keeping, keeper
from .lifecycle import Lifecycle
from .negotiation import retry_accepts
from .options import Options
from .problems import problem_response
from .replay import NotStorable, StoredResponse, capture
from .resend import check_resent, check_resumed, kept_request
from .scope import bounded_scope, default_scope
from .shards import key_database
from .steps import Steps

logger = logging.getLogger("django_idempotency")


@dataclass(frozen=True)
class RequestIdempotency:
    """What a view sees as ``request.idempotency``."""

    scope: str
    key: str
    fingerprint: str
    replayed: bool = False
    #: The steps of a view declared with ``steps=True`` (docs/steps.md), else None.
    steps: Steps | None = None

    def downstream_key(self, name: str = "default") -> str:
        """A key for an outside service (e.g. a payment provider's Idempotency-Key),
        the same for every retry of this request."""
        return downstream_key(conf.DOWNSTREAM_KEY_SECRET, self.scope, self.key, name)


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

    def __init__(
        self, request: HttpRequest, attempt: Attempt, strategy: Strategy, *, completer: bool = False
    ) -> None:
        self.request = request
        #: Whether the view's steps keep its request for the completer (``completer=True``).
        self.completer = completer
        self.attempt = attempt
        self.strategy = strategy
        self.key, self.scope, self.fingerprint = attempt.key, attempt.scope, attempt.fingerprint
        self.outcome: Outcome | None = None
        #: The lifecycle of the attempt whose outcome this request answers with.
        self.lifecycle: Lifecycle | None = None
        # The lifecycle, and on top of it the lease keeper: unwound in that order, so the
        # heartbeat has stopped before the lifecycle commits or gives the key back.
        self._stack = ExitStack()
        self._lease: Keeping | None = None
        #: The steps of a claimed view with steps.
        self.steps: Steps | None = None

    # -- key -> scope -> fingerprint ---------------------------------------------------------

    @classmethod
    def from_request(
        cls,
        request: HttpRequest,
        scope: Callable[[HttpRequest], str],
        options: Options,
        key: KeyFunc | None = None,
    ) -> IdempotentRequest | None:
        """None when the request does not take part (method, or no key and not required).
        ``key`` is the view's own key hook (None: the header and ``KEY_BODY_FIELD``).
        Raises ``InvalidConfiguration`` first when the settings have an error."""
        conf.ensure_valid()
        resolved = options.resolve()
        # DRF's Request hands method and path over from Django's: ask Django's.
        django_request: HttpRequest = getattr(request, "_request", request)
        if not options.applies_to(request.method):
            check_resent(django_request, None, None)  # never unprotected: the completer's
            return None
        # The key (raises 400 errors), read with the body: see keysource.request_key.
        found = request_key(request, key)
        if found is None:
            check_resent(django_request, None, None)
            if resolved.required:
                raise MissingKey(missing_detail(hook=key is not None))
            return None
        bounded = bounded_scope(scope(request))
        check_resent(django_request, bounded, found)  # the completer's (docs/steps.md)
        strategy = get_strategy(resolved.strategy)
        if options.steps:
            strategy = steps_strategy(strategy)
        routed = conf.DATABASE_ROUTING is not None
        database = key_database(request) if routed else conf.DATABASE
        attempt = Attempt(
            scope=bounded,
            key=found,
            fingerprint=fingerprint(request),
            ttl=resolved.ttl,
            lock_timeout=resolved.lock_timeout,
            method=(django_request.method or "").upper(),
            path=django_request.get_full_path()[:2048],
            atomic=conf.ATOMIC,
            database=database,
            wait=resolved.wait,
            shard=database if routed else "",
        )
        return cls(request, attempt, strategy, completer=bool(options.steps and options.completer))

    # -- the lifecycle: claim, lease ---------------------------------------------------------

    @property
    def claimed(self) -> bool:
        return isinstance(self.outcome, Claim)

    def __enter__(self) -> Outcome:
        try:
            outcome = self._claim()
            info = RequestIdempotency(
                self.scope, self.key, self.fingerprint, steps=self._steps(outcome)
            )
            self.request.idempotency = info  # type: ignore[attr-defined]
            if isinstance(outcome, Claim):
                self._keep(outcome)
        except BaseException as exc:
            # ``with`` does not call __exit__ when __enter__ raises: end the lifecycle here
            # (roll back its transaction, release the key) instead of leaving it to the
            # garbage collector while the traceback, and the open transaction, live on.
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return outcome

    def _steps(self, outcome: Outcome) -> Steps | None:
        """The steps of a claim of a view with steps (its claim records them)."""
        if not isinstance(outcome, StepClaim):
            return None
        assert self.lifecycle is not None
        check_resumed(getattr(self.request, "_request", self.request), outcome.kept)
        keep = None
        if self.completer and "request" not in outcome.kept:
            kept = kept_request(self.request, self.attempt.lock_timeout)
            keep = None if kept is None else {"request": kept}
        self.steps = Steps(self.lifecycle, outcome, self.scope, self.key, keep)
        return self.steps

    def _claim(self) -> Outcome:
        """Claim through a lifecycle, waiting for a key in progress when the attempt's
        ``wait`` is set. While a receiver listens to ``signals.claim_timed`` (metrics), the
        claim is timed (waits included) and sent with its outcome."""
        timed = bool(signals.claim_timed.receivers)
        started = time.perf_counter() if timed else 0.0
        label = "error"
        try:
            if self.attempt.wait > 0 and not self.strategy.waits_in_claim:
                outcome = self._claim_or_wait()
            else:
                outcome = self._enter(self._stack)
            label = outcome.label
        finally:
            if timed:
                seconds = time.perf_counter() - started
                self._send(signals.claim_timed, outcome=label, seconds=seconds)
        return outcome

    def _claim_or_wait(self) -> Outcome:
        """Claim; while the key is in progress, wait for its holder to complete or release
        it (a notification, or the poll interval) and claim again, until the deadline.

        The waiter subscribes before its first claim, so that a wake-up sent between
        that claim and the wait is not lost; a released key is claimed by one waiter
        (the claim is atomic) and the others find it in progress again."""
        attempt = self.attempt
        deadline = time.monotonic() + attempt.wait
        listener = self.strategy.listener(attempt)
        if listener is not None:
            listener.ensure()  # not ready (store unreachable): the waiter polls
        with waiting.hub.subscribe(key_digest(self.scope, self.key)) as woken:
            outcome = self._claim_once()
            if not isinstance(outcome, InProgress) or not waiting.slots.acquire():
                return outcome  # past WAIT_MAX_WAITERS: the 409 at once
            try:
                self._event(
                    "wait_started",
                    signals.wait_started,
                    logging.DEBUG,
                    "idempotency key %s (scope %s) is in progress; waiting up to %ss",
                    attempt.wait,
                )
                poll = max(conf.WAIT_POLL_INTERVAL, 0.01)
                while isinstance(outcome, InProgress):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._event(
                            "wait_timed_out",
                            signals.wait_timed_out,
                            logging.INFO,
                            "idempotency key %s (scope %s) still in progress after %ss",
                            attempt.wait,
                        )
                        return outcome
                    woken.wait(min(remaining, poll))
                    woken.clear()  # before the claim: a wake-up during it is kept
                    outcome = self._claim_once()
            finally:
                waiting.slots.release()
        if isinstance(outcome, Replay):
            self._send(signals.wait_replayed)
        return outcome

    def _claim_once(self) -> Outcome:
        """One lifecycle; kept (in ``_stack``) unless the key was in progress."""
        with ExitStack() as stack:
            outcome = self._enter(stack)
            if not isinstance(outcome, InProgress):
                self._stack.enter_context(stack.pop_all())
        return outcome

    def _enter(self, stack: ExitStack) -> Outcome:
        """Claim through a new :class:`Lifecycle`, entered on ``stack``."""
        lifecycle = stack.enter_context(Lifecycle(self.strategy, self.attempt))
        self.lifecycle = lifecycle
        assert lifecycle.outcome is not None
        self.outcome = lifecycle.outcome
        return lifecycle.outcome

    def _keep(self, claim: Claim) -> None:
        """Announce the claim and keep its lease alive until ``finish()`` or the exit."""
        taken_over = claim.taken_over
        self._event(
            claim.label,
            signals.key_taken_over if taken_over else signals.key_claimed,
            logging.WARNING if taken_over else logging.DEBUG,
            "idempotency key %s (scope %s) %s",
            "taken over from a stale lease" if taken_over else "claimed",
        )
        # Renew well within *this* request's lock timeout: a view may set a
        # shorter one than the global LOCK_TIMEOUT the default interval comes from.
        interval = min(conf.HEARTBEAT_INTERVAL, self.attempt.lock_timeout / 3)
        self._lease = keeper.keep(claim, interval)
        self._stack.enter_context(self._lease)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, ExitStack()
        error = exc
        try:
            stack.__exit__(exc_type, exc, tb)
        except BaseException as raised:
            error = raised
            raise
        finally:
            if error is not None and isinstance(self.outcome, Claim):
                self._report_error(error)

    def _report_error(self, error: BaseException) -> None:
        if self.lifecycle is not None and self.lifecycle.committed:
            self._event(
                "committed",
                None,
                logging.ERROR,
                "idempotency key %s (scope %s) completed; the error raised after COMMIT "
                "(an on_commit hook) leaves the stored response in place",
            )
        elif isinstance(error, LeaseLost):
            self._event(
                "lease_lost",
                signals.lease_lost,
                logging.WARNING,
                "idempotency key %s (scope %s): claim lost, the view's writes were rolled back",
            )
        else:
            self._event(
                "released",
                signals.key_released,
                logging.INFO,
                "idempotency key %s (scope %s) released after an exception in the view",
            )

    # -- the answer: short_circuit() or finish() ---------------------------------------------

    def short_circuit(self) -> HttpResponse:
        """The response for an outcome other than a claim."""
        outcome = self.outcome
        if isinstance(outcome, Replay):
            return self._replay(outcome.response)
        if isinstance(outcome, Mismatch):
            self._event(
                "mismatch",
                signals.key_mismatch,
                logging.INFO,
                "idempotency key %s (scope %s) reused with a different request",
            )
            raise FingerprintMismatch()
        if isinstance(outcome, InProgress):
            self._event(
                "conflict",
                signals.request_conflict,
                logging.INFO,
                "idempotency key %s (scope %s) is in progress",
            )
            chosen = conf.RETRY_AFTER  # None: the strategy's
            raise RequestInProgress(
                retry_after=chosen if chosen is not None else outcome.retry_after
            )
        raise AssertionError(f"unexpected outcome {outcome!r}")

    def _replay(self, stored: StoredResponse) -> HttpResponse:
        """The stored response, as it was stored, to a retry that accepts its media type;
        ``ReplayNotAcceptable`` (406) to one that does not: a replay is never rendered
        again, and a client must not be handed a body it cannot parse."""
        media_type = stored.media_type if stored.replayable else None
        if not retry_accepts(self.request, media_type):
            self._event(
                "not_acceptable",
                None,
                logging.INFO,
                "idempotency key %s (scope %s) completed; its stored %s response is not "
                "acceptable to the retry",
                media_type,
            )
            raise ReplayNotAcceptable(
                original_status=stored.status, original_content_type=media_type
            )
        self._event(
            "replayed",
            signals.response_replayed,
            logging.INFO,
            "idempotency key %s (scope %s) replayed",
        )
        if not stored.replayable:
            raise ResponseNotStored(original_status=stored.status)
        return stored.to_http()

    def finish(self, response: HttpResponseBase) -> HttpResponseBase:
        """Store a storable response under the key, or release the key."""
        lifecycle = self.lifecycle
        assert lifecycle is not None and lifecycle.claimed
        if self.steps is not None:
            self.steps.flush()  # a remote step's result is durable whatever comes next
        if self._lease is not None:
            self._lease.stop()  # the view is done: no more renewals
        if response.status_code >= 500 and not conf.STORE_SERVER_ERRORS:
            lifecycle.release()
            self._event(
                "released",
                signals.key_released,
                logging.INFO,
                "idempotency key %s (scope %s) released: %s",
                "a server error",
            )
            return response
        try:
            stored = capture(response, self.request)
        except NotStorable as exc:
            # The view's writes commit all the same: the key is completed, and a retry is
            # told that the response was not kept instead of running the view again.
            stored = StoredResponse.not_stored(response.status_code, str(exc))
            self._event(
                "not_stored",
                None,
                logging.INFO,
                "idempotency key %s (scope %s) completed without its response: %s",
                exc,
            )
        lifecycle.complete(stored)
        self._send(signals.response_stored)
        return response

    # -- events ----------------------------------------------------------------------------

    def _event(
        self, outcome: str, signal: Signal | None, level: int, message: str, *args: object
    ) -> None:
        """Send ``signal`` (when there is one), then log ``message``, whose first two
        placeholders are the key and the scope, with the ``idempotency_*`` extra fields."""
        if signal is not None:
            self._send(signal)
        if not logger.isEnabledFor(level):
            return
        logger.log(
            level,
            message,
            self.key,
            self.scope,
            *args,
            extra={
                "idempotency_scope": self.scope,
                "idempotency_key": self.key,
                "idempotency_outcome": outcome,
                "idempotency_strategy": self.strategy.name,
            },
            stacklevel=2,
        )

    def _send(self, signal: Signal, **more: object) -> None:
        if not signal.receivers:
            return  # what Signal.send() finds first; no arguments built for nobody
        signal.send(
            sender=type(self.strategy),
            request=self.request,
            scope=self.scope,
            key=self.key,
            strategy=self.strategy.name,
            **more,
        )


#: What an entry point answers with a problem (:func:`problem_for`) instead of a 500.
ANSWERED: tuple[type[BaseException], ...] = (IdempotencyError, *DATABASE_ERRORS)


def problem_for(exc: BaseException, database: str | None = None) -> IdempotencyError:
    """The problem that answers ``exc`` (one of :data:`ANSWERED`), the one error-to-problem
    path of every entry point: an ``IdempotencyError`` is its own; a database error that a
    retry gets past is a 503 (:func:`transient_conflict_error`), and any other database
    error is raised again. ``database``: the alias of the request's key (None:
    ``DATABASE``)."""
    if isinstance(exc, IdempotencyError):
        return exc
    return transient_conflict_error(cast("DatabaseError | InterfaceError", exc), database)


def transient_conflict_error(
    exc: DatabaseError | InterfaceError, database: str | None = None
) -> IdempotencyError:
    """The 503 problem for a database error that a retry gets past: a transient conflict
    in the view's transaction, or a lost connection
    (``store.errors.classify_database_error``), logged; other database errors are raised
    again. By the time this runs the claim's lifecycle has rolled the view's writes back and
    released the key (unless the database could not be reached for that: the key is then
    taken over once its lease is stale). ``database``: the alias of the request's key
    (None: ``DATABASE``), whose connection tells a lost connection from a conflict."""
    error = classify_database_error(
        exc, connections[database or conf.DATABASE], retry_after=retry_after()
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
    return error


def handle(
    request: HttpRequest,
    view: Callable[[], HttpResponseBase],
    *,
    scope: Callable[[HttpRequest], str] = default_scope,
    options: Options | None = None,
    key: KeyFunc | None = None,
) -> HttpResponseBase:
    """Run ``view`` under the Idempotency-Key protocol (the function-view path); ``key`` is
    the view's own key hook (None: the header and ``KEY_BODY_FIELD``)."""
    options = options or Options()
    idem = None
    try:
        idem = IdempotentRequest.from_request(request, scope, options, key)
        if idem is None:
            return view()
        with idem:
            if not idem.claimed:
                return idem.short_circuit()
            return idem.finish(view())
    except ANSWERED as exc:
        database = None if idem is None else idem.attempt.database
        return problem_response(problem_for(exc, database), request=request)


# -- the async path ---------------------------------------------------------------------------


def takes_part(request: HttpRequest, options: Options, key: KeyFunc | None = None) -> bool:
    """Whether ``handle`` would do more than call the view: the method honours the header,
    and a key is required, or may be there (the header, a JSON body with ``KEY_BODY_FIELD``
    set, or a view with its own ``key`` hook). Reads the request line and headers only (no
    body, no database, no ``request.user``), so it is safe on the event loop."""
    conf.ensure_valid()
    if not options.applies_to(request.method):
        return False
    return (
        options.resolve().required
        or key is not None
        or header_value(request, conf.HEADER) is not None
        or may_carry_body_key(request)
    )


async def ahandle(
    request: HttpRequest,
    view: Callable[[], Awaitable[HttpResponseBase]],
    *,
    scope: Callable[[HttpRequest], str] = default_scope,
    options: Options | None = None,
    key: KeyFunc | None = None,
) -> HttpResponseBase:
    """Run the async ``view`` under the Idempotency-Key protocol (async function views and
    the middleware on an async stack).

    The whole lifecycle (claim, the view's transaction, completion or release) is one
    ``sync_to_async`` call: Django's ORM and its transactions are synchronous and belong
    to one thread's connection. Inside it, the view runs back on the event loop through
    ``async_to_sync``; while it runs, that thread serves the view's thread-sensitive calls
    (the async ORM: ``acreate()``...), so the view's writes go through the connection whose
    transaction also stores the response. A request without a key (or a method that does
    not take part) awaits the view directly. See docs/async.md.
    """
    options = options or Options()
    if not takes_part(request, options, key):
        return await view()

    async def run_view() -> HttpResponseBase:
        return await view()

    def run_lifecycle() -> HttpResponseBase:
        return handle(request, async_to_sync(run_view), scope=scope, options=options, key=key)

    return await sync_to_async(run_lifecycle, thread_sensitive=True)()
