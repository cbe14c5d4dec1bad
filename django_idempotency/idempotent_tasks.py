"""Celery tasks that take effect once per key: ``@idempotent_task`` and ``IdempotentTask``
(imports ``celery``).

A task of this class claims its key before its body runs, with the ``db`` strategy's
claim (one row of IdempotencyKey, under the scope ``task:<task name>``; or with the
``advisory_lock`` strategy's, ``idempotency_strategy``), and runs the
body in the :class:`~django_idempotency.protocol.lifecycle.Lifecycle`'s transaction,
whose last statement stores the body's return value (as JSON) fenced by the claim
token. So the body's database writes and the stored result commit together, or not
at all:

* a worker killed inside the body (``acks_late`` with ``reject_on_worker_lost``, both
  set by this class) leaves nothing behind; the redelivered message waits until the
  dead worker's lease lapses (``lock_timeout``), takes the key over and runs the body;
* a duplicate (published twice, redelivered, or the same key from another producer)
  that finds the key completed returns the stored result without running the body;
* a duplicate that finds the key in progress does not run either: it is published
  again for ``idempotency_countdown`` seconds later (as ``self.retry`` would, without
  counting a retry), and then finds the result;
* ``self.retry()`` inside the body rolls the body's writes back and gives the key back:
  the retry runs the body again, and only its run takes effect.

With ``idempotency_steps`` (``@idempotent_task(steps=True)``) the body runs in steps, as a
view declared with ``steps=True`` does (docs/steps.md): ``self.steps`` (a bound task's
``self``) is the :class:`~django_idempotency.protocol.steps.Steps` of this key, whose local
steps commit on their own with the key's recovery point, so that a message redelivered after
a worker died resumes after the last step that committed instead of running the body again
from the start.

The key is the task's id by default (one effect per message, whatever the broker
redelivers), else ``key(*args, **kwargs)``. It lives on ``idempotency_database`` (an alias,
or a function of the arguments that answers one), else on the database
``DATABASE_ROUTING = "router"`` routes ``IdempotencyKey`` to, else on ``DATABASE``; it must be
one of ``KEY_DATABASES``. See docs/celery.md.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject, Retry
from django.core.exceptions import ImproperlyConfigured

from .conf import conf
from .errors import DatabaseMisconfigured, FingerprintMismatch, LeaseLost
from .protocol.keysource import check_key
from .protocol.lease import keeper
from .protocol.lifecycle import Lifecycle
from .protocol.options import Options
from .protocol.replay import StoredResponse
from .protocol.scope import bounded_scope
from .protocol.shards import ROUTER
from .protocol.steps import Steps
from .strategies import load_strategy
from .strategies.base import Attempt, Claim, InProgress, Mismatch, Replay
from .strategies.stepped import StepClaim, steps_strategy

#: The strategies whose claim commits with the body's transaction: a task's ``strategy``.
TASK_STRATEGIES = ("db", "advisory_lock")
#: The ``Content-Type`` of a stored task result.
RESULT_TYPE = "application/json"

KeyFunction = Callable[..., str]
DatabaseChoice = str | Callable[..., str] | None


class TaskKeyReused(FingerprintMismatch):
    """The key was already used for a call of this task with other arguments: the body
    did not run. One key was given to two operations, and one of them has happened."""


class KeyInProgress(Retry):  # type: ignore[misc]
    """A duplicate found the key in progress: Celery's ``Retry`` of the same message,
    later (not a retry of the body)."""


class IdempotentTask(Task):  # type: ignore[misc]
    """A Celery task whose body takes effect once per key (see the module's docstring).

    Class attributes, also options of ``@idempotent_task`` and of ``@app.task(base=...)``:

    * ``idempotency_key``: ``(*args, **kwargs) -> str``, the key (default: the task id);
    * ``idempotency_ttl``: seconds the result is kept (default: ``IDEMPOTENCY["TTL"]``);
    * ``idempotency_lock_timeout``: seconds after which the claim of a worker that
      stopped renewing it (killed) is taken over (default: ``LOCK_TIMEOUT``);
    * ``idempotency_countdown``: seconds before a duplicate that found the key in
      progress looks again (default 1);
    * ``idempotency_strategy``: ``"db"`` (the default) or ``"advisory_lock"``
      (PostgreSQL: a duplicate waits up to ``lock_timeout`` for the running body, and a
      killed worker's lock is freed with its connection);
    * ``idempotency_database``: the alias of the key's database, or
      ``(*args, **kwargs) -> alias`` (default: see the module's docstring);
    * ``idempotency_steps``: the body runs in steps (``self.steps``; default False).

    A class (or ``@idempotent_task``) with another strategy is refused when it is
    declared (``ImproperlyConfigured``): a worker that imports it does not start.
    """

    acks_late = True
    reject_on_worker_lost = True
    idempotency_key: KeyFunction | None = None
    idempotency_ttl: float | None = None
    idempotency_lock_timeout: float | None = None
    idempotency_countdown: float = 1.0
    idempotency_strategy: str = "db"
    idempotency_database: DatabaseChoice = None
    idempotency_steps: bool = False

    @property
    def steps(self) -> Steps:
        """The steps of the running body's key (a task with ``idempotency_steps``)."""
        found: Steps | None = getattr(self.request, "idempotency_steps", None)
        if found is None:
            raise RuntimeError(
                f"task {self.name}: self.steps is for the body of a task declared with "
                "idempotency_steps = True (or @idempotent_task(steps=True)), run with a key"
            )
        return found

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_strategy(cls.idempotency_strategy, cls.__qualname__)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Refuse (``ImproperlyConfigured``) a task whose own ``idempotency_ttl`` is
        shorter than the broker's visibility timeout: a worker that imports it does not
        start (:func:`check_ttl`)."""
        super().on_bound(app)
        if cls.idempotency_ttl is not None:
            check_ttl(float(cls.idempotency_ttl), app.conf, cls.name or cls.__qualname__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        attempt = self.idempotency_attempt(args, kwargs)
        if attempt is None:
            return self.run(*args, **kwargs)
        return run_once(self, attempt, args, kwargs)

    def idempotency_attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Attempt | None:
        """The attempt for this call, or None when it has no key (a direct call of a
        task without a key function: there is no task id)."""
        key_func = type(self).idempotency_key
        key: str | None = getattr(self.request, "id", None)
        if key_func is not None:
            key = check_key(key_func(*args, **kwargs))
        if key is None:
            return None
        resolved = Options(
            ttl=self.idempotency_ttl, lock_timeout=self.idempotency_lock_timeout
        ).resolve()
        return Attempt(
            scope=bounded_scope(f"task:{self.name}"),
            key=key,
            fingerprint=arguments_fingerprint(args, kwargs),
            ttl=float(resolved.ttl),
            lock_timeout=float(resolved.lock_timeout),
            method="TASK",
            path=self.name,
            atomic=True,
            database=self.idempotency_key_database(args, kwargs),
        )

    def idempotency_key_database(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The alias that holds this call's key, one of ``KEY_DATABASES``
        (``DatabaseMisconfigured`` otherwise: the body does not run)."""
        choice = type(self).idempotency_database
        if callable(choice):
            alias: object = choice(*args, **kwargs)
        elif choice is not None:
            alias = choice
        elif conf.DATABASE_ROUTING == ROUTER:
            from django.db import router

            from .models import IdempotencyKey

            alias = router.db_for_write(IdempotencyKey)
        else:
            alias = conf.DATABASE
        if alias not in conf.KEY_DATABASES:
            raise DatabaseMisconfigured(
                f"task {self.name}: its key database {alias!r} is not one of "
                f"IDEMPOTENCY['KEY_DATABASES'] {list(conf.KEY_DATABASES)!r}"
            )
        return str(alias)

    def idempotency_wait(self) -> BaseException:
        """What a duplicate that found the key in progress raises: Celery's ``Retry``,
        after publishing the same message again in ``idempotency_countdown`` seconds
        with the same count of retries (waiting is not a retry of the body: it counts
        against no ``max_retries``). A publish that fails puts the message back on the
        queue (``Reject(requeue=True)``): it may be the key's only message."""
        request = self.request
        countdown = self.idempotency_countdown
        again = self.signature_from_request(request, countdown=countdown, retries=request.retries)
        wait = KeyInProgress("the key is in progress", when=countdown, sig=again)
        if request.called_directly or request.is_eager:
            return wait  # no worker: run_once waits in the caller's process
        try:
            again.apply_async()
        except Exception as exc:
            raise Reject(exc, requeue=True) from exc
        return wait


def arguments_fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The SHA-256 of the call's arguments as canonical JSON (keys sorted; what is not
    JSON compared by its ``str``)."""
    encoded = json.dumps([list(args), kwargs], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(encoded.encode()).hexdigest()


def check_strategy(strategy: str, where: str) -> None:
    """Refuse a task strategy that is not one of :data:`TASK_STRATEGIES`."""
    if strategy not in TASK_STRATEGIES:
        raise ImproperlyConfigured(
            f"{where}: idempotency_strategy {strategy!r} is not one of {TASK_STRATEGIES}: "
            "a task's claim must commit with its body's transaction"
        )


#: The visibility timeout of the brokers that take a message back only after one, by the
#: scheme of the broker's URL, when ``broker_transport_options`` sets none (kombu's).
VISIBILITY_TIMEOUTS = {
    "redis": 3600.0,
    "rediss": 3600.0,
    "redis+socket": 3600.0,
    "sentinel": 3600.0,
    "sqs": 1800.0,
}


def visibility_timeout(celery_conf: Any) -> float | None:
    """Seconds after which the broker of ``celery_conf`` hands an unacknowledged message
    to another worker, None for a broker that takes it back when its worker's connection
    drops (RabbitMQ's AMQP)."""
    url = celery_conf.broker_read_url or celery_conf.broker_url or ""
    first = url[0] if isinstance(url, list | tuple) and url else url
    default = VISIBILITY_TIMEOUTS.get(str(first).partition("://")[0].lower())
    if default is None:
        return None
    options = celery_conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", default))


def check_ttl(ttl: float, celery_conf: Any, where: str) -> None:
    """Refuse a task ``ttl`` shorter than the broker's visibility timeout. A worker killed
    between the body's commit and the message's ack leaves the message unacknowledged;
    such a broker hands it to another worker once the timeout is over, and a key expired
    by then (taken over as new, or purged) runs the body again."""
    timeout = visibility_timeout(celery_conf)
    if timeout is not None and ttl < timeout:
        raise ImproperlyConfigured(
            f"task {where}: idempotency_ttl {ttl:g}s is shorter than the broker's "
            f"visibility timeout ({timeout:g}s, broker_transport_options): a message "
            "redelivered after a worker died between the body's commit and its ack would "
            "find the key expired and run the body again. Keep the result at least that "
            "long (docs/celery.md, 'How long a key lives')"
        )


def run_once(task: IdempotentTask, attempt: Attempt, args: tuple[Any, ...], kwargs: Any) -> Any:
    """Run ``task``'s body under ``attempt``'s claim, or return the stored result. Called
    in the caller's process (``apply()``, or a direct call with a key function), a
    duplicate of a running body waits for it there, looking again every
    ``idempotency_countdown`` seconds, as long as the body's lease lives: no worker
    would look again for it."""
    while True:
        try:
            return run_claimed(task, attempt, args, kwargs)
        except KeyInProgress:
            request = task.request
            if not (request.called_directly or request.is_eager):
                raise
        time.sleep(task.idempotency_countdown)


def run_claimed(task: IdempotentTask, attempt: Attempt, args: tuple[Any, ...], kwargs: Any) -> Any:
    """One look at the key: run the body under its claim, return the stored result, or
    raise the task's wait (``Retry``) while the key is in progress."""
    conf.ensure_valid()
    strategy = load_strategy(task.idempotency_strategy)
    if task.idempotency_steps:
        strategy = steps_strategy(strategy)  # each of TASK_STRATEGIES has its stepped form
    try:
        with ExitStack() as stack:
            # Entered first, left last: the lease is no longer renewed when it commits.
            lifecycle = stack.enter_context(Lifecycle(strategy, attempt))
            outcome = lifecycle.outcome
            if isinstance(outcome, Claim):
                interval = min(conf.HEARTBEAT_INTERVAL, attempt.lock_timeout / 3)
                keeping = keeper.keep(outcome, interval)
                stack.enter_context(keeping)
                steps = None
                if isinstance(outcome, StepClaim):
                    steps = Steps(lifecycle, outcome, attempt.scope, attempt.key)
                task.request.idempotency_steps = steps
                try:
                    result = task.run(*args, **kwargs)
                    if steps is not None:
                        steps.flush()  # a remote step's result is durable whatever follows
                finally:
                    task.request.idempotency_steps = None
                body = json.dumps(result).encode()
                keeping.stop()  # the body is done: no renewal races the completion's COMMIT
                lifecycle.complete(StoredResponse(200, {"Content-Type": RESULT_TYPE}, body))
                return result
    except LeaseLost:
        # Another worker took the key over and runs (or ran) the body: ask again later.
        raise task.idempotency_wait() from None
    if isinstance(outcome, Replay):
        return json.loads(outcome.response.body) if outcome.response.body else None
    if isinstance(outcome, InProgress):
        raise task.idempotency_wait()
    if isinstance(outcome, Mismatch):
        raise TaskKeyReused(f"key {attempt.key!r} of {task.name} was used with other arguments")
    raise AssertionError(f"unexpected outcome {outcome!r}")


def idempotent_task(
    func: Callable[..., Any] | None = None,
    *,
    key: KeyFunction | None = None,
    ttl: float | None = None,
    lock_timeout: float | None = None,
    countdown: float = 1.0,
    strategy: str = "db",
    database: DatabaseChoice = None,
    steps: bool = False,
    **options: Any,
) -> Any:
    """``@idempotent_task`` or ``@idempotent_task(key=..., ttl=..., name=...)``: a
    ``shared_task`` of :class:`IdempotentTask`; ``options`` are Celery's task options.
    ``strategy``: one of :data:`TASK_STRATEGIES` (``ImproperlyConfigured`` otherwise);
    ``database``: the key's database (see :class:`IdempotentTask`); ``steps``: the body
    runs in steps (``self.steps``, with ``bind=True``)."""
    check_strategy(strategy, "@idempotent_task")

    def decorate(body: Callable[..., Any]) -> Any:
        return shared_task(
            base=IdempotentTask,
            idempotency_key=None if key is None else staticmethod(key),
            idempotency_ttl=ttl,
            idempotency_lock_timeout=lock_timeout,
            idempotency_countdown=float(countdown),
            idempotency_strategy=strategy,
            idempotency_database=staticmethod(database) if callable(database) else database,
            idempotency_steps=steps,
            **options,
        )(body)

    if func is not None:
        return decorate(func)
    return decorate
