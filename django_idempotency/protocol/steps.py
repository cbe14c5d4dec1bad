"""Steps with recovery points: a view that resumes where a crashed attempt stopped.

A view declared with ``steps=True`` (``@idempotent(steps=True)``,
``idempotency_steps = True``) finds :class:`Steps` as ``request.idempotency.steps``::

    steps = request.idempotency.steps
    charge_id = steps.local("create_charge", create_charge_row)
    answer = steps.remote("call_provider", lambda key: provider.charge(..., idempotency_key=key))
    steps.local("record_answer", record, charge_id, answer)
    steps.local("send_receipt", queue_receipt, charge_id)

* :meth:`Steps.local` runs its function in a transaction of its own, which also records
  the step's JSON result and the key's recovery point, fenced by the claim token (a
  worker whose claim was taken over gets ``LeaseLost``, and its step rolls back).
* :meth:`Steps.remote` calls another system outside every transaction with a downstream
  key derived from the request's key and the step's name, the same on every retry; its
  result is recorded by the next commit (the next local step's, or the completion's).
* On a retry, a step already done returns its stored result without running; the view
  goes on from the first step not done. A result is stored as JSON and returned as JSON
  reads it back, the first time too, so that a view sees the same value either way.

The steps must come in the same order on every attempt of a key
(:class:`StepOrderError` otherwise). See docs/steps.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder

from ..conf import conf
from ..errors import RemoteOutcomeUnknown
from .keys import downstream_key

if TYPE_CHECKING:
    from ..strategies.stepped import StepClaim
    from .lifecycle import Lifecycle

logger = logging.getLogger("django_idempotency")

LOCAL = "local"
REMOTE = "remote"
#: The member of the row's ``steps`` that names the remote step last called (the claim's
#: ``kept``, with the completer's request: ``StepClaim.record`` keeps it up to date).
CALLING = "calling"


class StepOrderError(RuntimeError):
    """A step other than the one the key recorded at this position: the view's steps are
    not the same on every attempt (a programming error, raised before anything runs)."""


def as_json(value: Any) -> Any:
    """``value`` as JSON reads it back (``DjangoJSONEncoder``: dates, decimals, UUIDs)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


class Steps:
    """The steps of one claimed request (``request.idempotency.steps``)."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        claim: StepClaim,
        scope: str,
        key: str,
        keep: dict[str, Any] | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._claim = claim
        self._scope, self._key = scope, key
        #: Members of the row's ``steps`` the first commit writes (the completer's request),
        #: None once written or when there are none.
        self._keep = keep or None
        #: Steps recorded by a commit (loaded at the claim, then ours), in order.
        self._done: list[dict[str, Any]] = list(claim.done)
        #: Remote steps done, waiting for the next commit.
        self._pending: list[dict[str, Any]] = []
        #: How many steps this attempt has passed (done before or run now).
        self._position = 0
        #: Whether this attempt found steps done by an earlier one.
        self.resumed = bool(claim.done)

    @property
    def recovery_point(self) -> str | None:
        """The last step recorded by a commit (None before the first)."""
        return self._done[-1]["name"] if self._done else None

    def done(self, name: str) -> bool:
        """Whether step ``name`` is done (recorded, or pending its commit)."""
        return any(entry["name"] == name for entry in self._done + self._pending)

    def local(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this key: in a transaction of its own that
        records its result (JSON) and the recovery point ``name``; on a retry after that
        transaction committed, the stored result without running it."""
        stored = self._stored(name, LOCAL)
        if stored is not None:
            return stored["result"]
        with self._lifecycle.phase():
            result = as_json(fn(*args, **kwargs))
            entry = {"name": name, "kind": LOCAL, "result": result}
            self._claim.record([*self._done, *self._pending, entry], name, self._keep)
        self._keep = None
        self._commit_recorded(entry)
        return result

    def remote(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(downstream_key, *args, **kwargs)`` outside every transaction, with the
        downstream key of this request and step (:meth:`downstream_key`); its result (JSON)
        is recorded by the next commit. On a retry after that commit, the stored result
        without calling; before it, ``fn`` is called again with the same key, which the
        other system recognises."""
        stored = self._stored(name, REMOTE)
        if stored is not None:
            return stored["result"]
        if self._claim.kept.get(CALLING) == name:  # an earlier attempt's mark
            self._check_lifetime(name)
        else:
            # Durable before the call: an earlier remote step's result, and the mark that
            # this one may take effect from now on (the key is kept for its retry, and the
            # lifetime of its downstream key counts).
            self._keep = {**(self._keep or {}), CALLING: name}
        self.flush()
        result = as_json(fn(self.downstream_key(name), *args, **kwargs))
        self._pending.append({"name": name, "kind": REMOTE, "result": result})
        self._position += 1
        return result

    def downstream_key(self, name: str) -> str:
        """The key step ``name`` sends to another system: the same for every retry of this
        request (``RequestIdempotency.downstream_key(name)``)."""
        return downstream_key(conf.DOWNSTREAM_KEY_SECRET, self._scope, self._key, name)

    def flush(self) -> None:
        """Record the remote steps' results waiting for a commit (and, before the first
        step, what the first commit keeps), in one of their own. The completion and every
        remote step call it; a view need not."""
        if not self._pending and self._keep is None:
            return
        point = self._pending[-1]["name"] if self._pending else self.recovery_point
        with self._lifecycle.phase():
            self._claim.record([*self._done, *self._pending], point, self._keep)
        self._keep = None
        self._done += self._pending
        self._pending = []

    def _check_lifetime(self, name: str) -> None:
        """An earlier attempt called step ``name`` and ended before its result was recorded:
        ``RemoteOutcomeUnknown`` unless the key was first claimed within
        ``DOWNSTREAM_KEY_LIFETIME`` (the other service still knows the downstream key, and
        answers the call made again with the first one's result), less the longest a live
        owner may take from this check to its call: its lease and a pause as long (the
        protocol's assumption, docs/how-it-works.md), so that the call never reaches the
        other service after it forgot the key."""
        lifetime = conf.DOWNSTREAM_KEY_LIFETIME
        if lifetime is None:
            return
        window = lifetime - 2 * self._claim.attempt.lock_timeout
        if window > 0 and self._claim.first_claimed_within(window):
            return
        logger.error(
            "idempotency key %s (scope %s): its remote step %r was called by an earlier "
            "attempt that did not record the result, and the key was first claimed %ss or "
            "more ago (DOWNSTREAM_KEY_LIFETIME less two leases): not called again (409 "
            "remote-outcome-unknown). Look the step's downstream key %s up at the other "
            "service and reconcile it",
            self._key,
            self._scope,
            name,
            max(window, 0),
            self.downstream_key(name),
            extra={
                "idempotency_scope": self._scope,
                "idempotency_key": self._key,
                "idempotency_outcome": "remote_outcome_unknown",
            },
        )
        raise RemoteOutcomeUnknown()

    def _commit_recorded(self, entry: dict[str, Any]) -> None:
        self._done += [*self._pending, entry]
        self._pending = []
        self._position += 1

    def _stored(self, name: str, kind: str) -> dict[str, Any] | None:
        """The step recorded at this position (it must be ``name``), or None when this
        position is past the steps done."""
        position = self._position
        if position >= len(self._done):
            if self.done(name):
                raise StepOrderError(f"step {name!r} runs twice in one view")
            return None
        entry = self._done[position]
        if entry.get("name") != name or entry.get("kind") != kind:
            raise StepOrderError(
                f"step {position + 1} of this key was {entry.get('kind')} step "
                f"{entry.get('name')!r}, not {kind} step {name!r}: a view's steps must "
                "come in the same order on every attempt"
            )
        self._position += 1
        return entry
