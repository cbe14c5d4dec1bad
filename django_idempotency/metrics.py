"""Prometheus metrics, on when ``IDEMPOTENCY["METRICS"]`` is true (needs ``prometheus_client``).

The app config installs them at start-up; nothing else imports this module, so
``prometheus_client`` stays optional. Exported:

``django_idempotency_events_total{event, strategy}``
    one per signal the engine sends: ``claimed``, ``taken_over``, ``replayed``,
    ``conflict``, ``mismatch``, ``released``, ``stored``, ``lease_lost``, and for
    duplicates that wait (``WAIT``) ``wait_started``, ``wait_replayed``, ``wait_timed_out``.
``django_idempotency_claim_duration_seconds{strategy, outcome}``
    the time to claim a key (for ``advisory_lock`` this includes waiting for the
    lock, and for a duplicate that waits (``WAIT``) its wait), by outcome: ``claimed``,
    ``taken_over``, ``in_progress``, ``replay``, ``mismatch`` or ``error``.

``django_idempotency_completer_runs_total{outcome}``
    one per key the completer handled (``signals.completer_ran``): ``completed``,
    ``failed``, ``dead_lettered`` or ``taken``.

``django_idempotency_redis_fallback_requests_total{strategy}``
    requests the ``redis`` or ``hybrid`` strategy handled without Redis (the ``db``
    fallback, or 503 with ``REDIS_FAILURE_MODE = "fail_closed"``).
``django_idempotency_redis_fallback_active``
    1 while a fallback episode is on in a process, 0 once a request reached Redis again
    (see ``redis_health``; the largest value over the live processes in multiprocess mode).

Under gunicorn with several worker processes, set ``PROMETHEUS_MULTIPROC_DIR``
as ``prometheus_client`` documents; the metrics here need nothing else for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from django.dispatch import Signal
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from . import signals
from .strategies.redis import health as redis_health

logger = logging.getLogger("django_idempotency")

#: The label each signal is counted under.
EVENTS: dict[str, Signal] = {
    "claimed": signals.key_claimed,
    "taken_over": signals.key_taken_over,
    "replayed": signals.response_replayed,
    "conflict": signals.request_conflict,
    "mismatch": signals.key_mismatch,
    "released": signals.key_released,
    "stored": signals.response_stored,
    "lease_lost": signals.lease_lost,
    "wait_started": signals.wait_started,
    "wait_replayed": signals.wait_replayed,
    "wait_timed_out": signals.wait_timed_out,
}

#: Claims take a millisecond or two; advisory-lock waits can take up to LOCK_TIMEOUT.
CLAIM_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass
class Metrics:
    """The collectors on one registry, and the receivers that feed them."""

    registry: CollectorRegistry
    events: Any = field(init=False)
    claim_seconds: Any = field(init=False)
    fallbacks: Any = field(init=False)
    fallback_active: Any = field(init=False)
    completer_runs: Any = field(init=False)
    _receivers: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.events = Counter(
            "django_idempotency_events",
            "Idempotency-Key events, one per signal sent by the engine.",
            ["event", "strategy"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "django_idempotency_claim_duration_seconds",
            "Time to claim an Idempotency-Key (including advisory-lock waits), by outcome.",
            ["strategy", "outcome"],
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "django_idempotency_redis_fallback_requests",
            "Requests the redis or hybrid strategy handled without Redis.",
            ["strategy"],
            registry=self.registry,
        )
        self.fallback_active = Gauge(
            "django_idempotency_redis_fallback_active",
            "1 while requests are handled without Redis (a fallback episode), else 0.",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.completer_runs = Counter(
            "django_idempotency_completer_runs",
            "Keys the completer handled, by outcome.",
            ["outcome"],
            registry=self.registry,
        )

    def connect(self) -> None:
        for event, signal in EVENTS.items():
            receiver = self._receiver(event)
            self._receivers[event] = receiver
            signal.connect(receiver, weak=False, dispatch_uid=_uid(event))
        signals.claim_timed.connect(self.observe_claim, weak=False, dispatch_uid=_uid("claim"))
        signals.completer_ran.connect(
            self.observe_completer, weak=False, dispatch_uid=_uid("completer")
        )
        redis_health.monitor.observer = self.observe_fallback

    def disconnect(self) -> None:
        for event, signal in EVENTS.items():
            signal.disconnect(dispatch_uid=_uid(event))
        self._receivers.clear()
        signals.claim_timed.disconnect(dispatch_uid=_uid("claim"))
        signals.completer_ran.disconnect(dispatch_uid=_uid("completer"))
        if redis_health.monitor.observer == self.observe_fallback:
            redis_health.monitor.observer = None
        collectors = (self.events, self.claim_seconds, self.fallbacks, self.fallback_active)
        for collector in (*collectors, self.completer_runs):
            with contextlib.suppress(KeyError):  # already unregistered
                self.registry.unregister(collector)

    def observe_claim(
        self, sender: Any, strategy: str = "", outcome: str = "", seconds: float = 0.0, **kw: Any
    ) -> None:
        """``signals.claim_timed``'s receiver: the claim's duration by strategy and outcome."""
        try:
            self.claim_seconds.labels(strategy=strategy or "unknown", outcome=outcome).observe(
                seconds
            )
        except Exception:  # a metric must never fail a request
            logger.exception("could not record the claim duration")

    def observe_completer(self, sender: Any, outcome: str = "", **kwargs: Any) -> None:
        """``signals.completer_ran``'s receiver: one key the completer handled."""
        try:
            self.completer_runs.labels(outcome=outcome or "unknown").inc()
        except Exception:  # a metric must never fail the completer
            logger.exception("could not count the completer's run")

    def observe_fallback(self, event: str, strategy: str) -> None:
        """``redis_health``'s observer: a request without Redis, or the episode's end."""
        if event == "fallback":
            self.fallbacks.labels(strategy=strategy or "unknown").inc()
            self.fallback_active.set(1)
        else:
            self.fallback_active.set(0)

    def _receiver(self, event: str) -> Any:
        counter = self.events

        def receive(sender: Any, strategy: str = "", **kwargs: Any) -> None:
            try:
                counter.labels(event=event, strategy=strategy or "unknown").inc()
            except Exception:  # a metric must never fail a request
                logger.exception("could not count the %s event", event)

        return receive


def _uid(event: str) -> str:
    return f"django_idempotency.metrics.{event}"


_lock = threading.Lock()
_installed: Metrics | None = None


def install(registry: CollectorRegistry | None = None) -> Metrics:
    """Create the collectors on ``registry`` (default: the global one) and connect them.

    Installing again replaces the previous installation (its collectors are
    unregistered), so it is safe to call more than once.
    """
    global _installed
    with _lock:
        if _installed is not None:
            _installed.disconnect()
        metrics = Metrics(registry if registry is not None else REGISTRY)
        metrics.connect()
        _installed = metrics
        return metrics


def uninstall() -> None:
    """Disconnect the receivers and unregister the collectors."""
    global _installed
    with _lock:
        if _installed is not None:
            _installed.disconnect()
            _installed = None


def installed() -> Metrics | None:
    return _installed
