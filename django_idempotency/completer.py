"""The completer: finishes the requests whose client did not come back (docs/steps.md,
"The completer").

A view declared with ``steps=True, completer=True`` keeps its request in its key's row
(:mod:`.protocol.resend`) with its first step's commit. When such a key is still in progress
``COMPLETER_AFTER`` seconds after its lease lapsed (the view's ``LOCK_TIMEOUT`` since its last
renewal, both on the database's clock), no retry of its client has taken it over: the
completer sends the kept request to the view again, as its user, and the view resumes from
its recovery point as a retry would, under the same claim, fencing and steps. Its answer is
stored under the key, so that the client's retry, when it comes, is replayed.

Each run of a key is counted on its row first, while the row is as it was read (its claim
token, and a lease still lapsed: a step recorded since renewed it); the view then claims
the key as a retry would, taking it over from an owner that is gone. A key is run at most
``COMPLETER_ATTEMPTS`` times, then left *dead-lettered* (the admin shows it; its client's
retry still resumes it). A key whose request cannot be sent again (its user deleted, its
path no longer resolving, a scope the kept request does not reproduce) is dead-lettered at
once. Under ``advisory_lock`` too a running request renews its lease.

The completer's own statements (the query for due keys, each run's count, the read of the
outcome) are bounded by ``DATABASE_TIMEOUT`` on PostgreSQL, as the requests' are: a
database that falls silent ends the run with the driver's error (the command exits 1, the
task fails and its next beat runs again), never a run that hangs. A count whose answer never
came may have been written: the key then has one run counted that it did not have (its
attempts run out one run early), never a run it was not counted for.

Run it with ``manage.py complete_idempotency_keys`` (cron) or the Celery task
``django_idempotency.complete_requests`` (:mod:`.completer_tasks`).
"""

from __future__ import annotations

import datetime
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve

from . import signals
from .conf import conf
from .middleware import view_options
from .models import IdempotencyKey
from .protocol.resend import CannotResend, rebuild
from .store.clock import DatabaseNow, database_ago
from .store.databases import key_databases
from .store.sql.deadline import bounded
from .store.status import COMPLETED, IN_PROGRESS

logger = logging.getLogger("django_idempotency")

#: The outcomes of one run of a key (``signals.completer_ran``'s ``outcome``).
COMPLETED_RUN = "completed"
FAILED = "failed"
DEAD_LETTERED = "dead_lettered"
TAKEN = "taken"  # a retry or another completer took the key first, or it was deleted: not run
OUTCOMES = (COMPLETED_RUN, FAILED, DEAD_LETTERED, TAKEN)


@dataclass
class Report:
    """How many keys each outcome had, in one run of :func:`complete_requests`."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def __getitem__(self, outcome: str) -> int:
        return self.counts[outcome]


@dataclass(frozen=True)
class Due:
    """A key the completer finishes: its row as it was read, and the database's now."""

    pk: int
    scope: str
    key: str
    claim_token: uuid.UUID
    locked_at: datetime.datetime
    steps: dict[str, Any]
    now: datetime.datetime

    @property
    def attempts(self) -> int:
        return int((self.steps.get("completer") or {}).get("attempts", 0))

    @property
    def wait(self) -> datetime.timedelta:
        """How long after its last renewal the key is the completer's: the view's lease
        (its ``LOCK_TIMEOUT``, kept with the request) and ``COMPLETER_AFTER``."""
        lease = float(self.steps["request"].get("lock_timeout", 0))
        return datetime.timedelta(seconds=lease + conf.COMPLETER_AFTER)


def complete_requests(*, using: str | None = None, limit: int = 100) -> Report:
    """Finish up to ``limit`` due keys on the database ``using``, or on each key database
    in turn; how many had each outcome."""
    conf.ensure_valid()
    report = Report()
    for alias in key_databases(using):
        for due in due_keys(alias, limit):
            report.add(complete(alias, due))
    return report


def due_keys(alias: str, limit: int) -> list[Due]:
    """The keys on ``alias`` whose request the completer is to finish now: in progress,
    with a kept request, not dead-lettered, their lease lapsed ``COMPLETER_AFTER`` ago (on
    the database's clock), longest waiting first."""
    after = datetime.timedelta(seconds=conf.COMPLETER_AFTER)
    rows = (
        IdempotencyKey.objects.using(alias)
        .filter(status=IN_PROGRESS, steps__has_key="request", locked_at__lte=database_ago(after))
        .filter(steps__completer__dead__isnull=True)  # only ever written True
        .annotate(now=DatabaseNow())
        .order_by("locked_at")
        .values_list("pk", "scope", "key", "claim_token", "locked_at", "steps", "now")
    )
    with bounded(connections[alias]):  # DATABASE_TIMEOUT
        listed = list(rows[: max(int(limit), 0)])
    found = []
    for row in listed:
        due = Due(*row)  # type: ignore[arg-type]  # locked_at and steps: not null here
        # Its own lease too (the view's LOCK_TIMEOUT): a key not due yet is left to a
        # later run.
        if due.locked_at + due.wait <= due.now:
            found.append(due)
    return found


def complete(alias: str, due: Due) -> str:
    """Run ``due``'s request once more, or dead-letter it; its outcome (:data:`OUTCOMES`)."""
    attempts = due.attempts + 1
    if attempts > conf.COMPLETER_ATTEMPTS:
        return _dead_letter(alias, due, due.attempts, "no attempts left")
    if not _mark(alias, due, {"attempts": attempts}):
        return _ran(due, TAKEN, attempts)
    try:
        request = rebuild(due.steps["request"], due.scope, due.key)
        response = send(request)
    except CannotResend as exc:  # refused before the view claimed the key
        return _dead_letter(alias, due, attempts, str(exc))
    except Exception:
        logger.exception(
            "the completer's run %d of idempotency key %s (scope %s) failed",
            attempts,
            due.key,
            due.scope,
        )
        response = None
    # By the key, not the id: a takeover on a partitioned table inserts the row anew.
    status = (
        IdempotencyKey.objects.using(alias)
        .filter(scope=due.scope, key=due.key)
        .order_by("-created_at")
        .values_list("status", flat=True)
    )
    with bounded(connections[alias]):  # DATABASE_TIMEOUT
        ended = status.first()
    if ended == COMPLETED:
        return _ran(due, COMPLETED_RUN, attempts, response)
    return _ran(due, FAILED, attempts, response)


def send(request: HttpRequest) -> HttpResponseBase:
    """``request`` answered by the view its path resolves to (in the root URLconf), as
    Django's handler calls it, without the project's middleware; ``CannotResend`` when that
    view does not declare the completer (any more): it might run unprotected."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        raise CannotResend(f"the path {request.path_info!r} no longer resolves") from None
    if not declares_completer(match.func):
        raise CannotResend(
            f"the view of {request.path_info!r} does not declare steps=True, completer=True"
        )
    response: HttpResponseBase = match.func(request, *match.args, **match.kwargs)
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        render()
    return response


def declares_completer(callback: Any) -> bool:
    """Whether the view ``callback`` keeps its requests for the completer: declared with
    ``steps=True, completer=True`` (:func:`~django_idempotency.middleware.view_options`)."""
    options = view_options(callback)
    return options is not None and options.steps is True and options.completer is True


def _mark(alias: str, due: Due, completer: dict[str, Any]) -> bool:
    """Write ``completer`` into the row's ``steps`` (read with ``due``) while the row is as
    it was read: the same claim token, in progress, and a lease still lapsed
    ``COMPLETER_AFTER`` ago on the database's clock (every record of a step, and every
    renewal, sets the lease anew: nothing they wrote is written over). Whether it was."""
    state = {**(due.steps.get("completer") or {}), **completer}
    with bounded(connections[alias]):  # DATABASE_TIMEOUT: an answer not come is unknown
        marked = (
            IdempotencyKey.objects.using(alias)
            .filter(
                pk=due.pk,
                claim_token=due.claim_token,
                status=IN_PROGRESS,
                locked_at__lte=database_ago(due.wait),
            )
            .update(steps={**due.steps, "completer": state})
        )
    return bool(marked)


def _dead_letter(alias: str, due: Due, attempts: int, reason: str) -> str:
    """Leave ``due`` to its client's retry alone, and say why."""
    marked = {"attempts": attempts, "dead": True, "reason": reason[:500]}
    if not _mark(alias, due, marked):
        return _ran(due, TAKEN, attempts)
    logger.error(
        "idempotency key %s (scope %s) is dead-lettered after %d run(s) of the completer: %s",
        due.key,
        due.scope,
        attempts,
        reason,
    )
    signals.request_dead_lettered.send(
        sender=IdempotencyKey, scope=due.scope, key=due.key, attempts=attempts, reason=reason
    )
    return _ran(due, DEAD_LETTERED, attempts)


def _ran(due: Due, outcome: str, attempts: int, response: HttpResponseBase | None = None) -> str:
    signals.completer_ran.send(
        sender=IdempotencyKey,
        scope=due.scope,
        key=due.key,
        outcome=outcome,
        attempts=attempts,
        status=None if response is None else response.status_code,
    )
    return outcome
