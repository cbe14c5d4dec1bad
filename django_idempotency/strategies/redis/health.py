"""Redis fallback episodes: how long this process has been running without Redis.

While Redis cannot be reached, the ``redis`` and ``hybrid`` strategies hand each request
to the ``db`` strategy (``REDIS_FAILURE_MODE = "db"``, with a warning per request) or
answer 503 (``"fail_closed"``). An
outage that lasts (a wrong password, a TLS or ACL mistake, a dead server) must not hide
behind those warnings: once an episode is older than ``ALERT_AFTER`` seconds it is logged
at ERROR, once, and :func:`health` reports it to a health endpoint. The first request that
reaches Redis again ends the episode. The state is per process (each worker of a server
has its own). See docs/observability.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("django_idempotency")

#: Seconds of fallback after which an episode is logged at ERROR (once per episode).
ALERT_AFTER = 5.0


@dataclass(frozen=True)
class Health:
    """What :func:`health` returns; ``ok`` is False while a fallback episode is older than
    ``ALERT_AFTER`` seconds."""

    ok: bool
    #: The episode's start (``time.time()``), or None while Redis answers.
    redis_fallback_since: float | None
    #: Seconds since then (0.0 while Redis answers).
    redis_fallback_seconds: float
    #: Requests handled without Redis in this episode (db strategy, or 503).
    redis_fallback_requests: int
    #: The error of the latest fallback in this episode ("" while Redis answers).
    redis_last_error: str


class FallbackMonitor:
    """One process's fallback episode; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None  # time.monotonic() at the episode's start
        self._since_wall = 0.0
        self._requests = 0
        self._error = ""
        self._alerted = False
        #: Called with ("fallback", strategy) per request handed over and ("recovered",
        #: strategy) when an episode ends (the metrics).
        self.observer: Callable[[str, str], None] | None = None

    @property
    def active(self) -> bool:
        return self._since is not None

    def fell_back(self, strategy: str, error: BaseException | str) -> None:
        """A request of ``strategy`` is handled without Redis (by the ``db`` strategy, or
        a 503) because of ``error``."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since, self._since_wall = now, time.time()
                self._requests, self._alerted = 0, False
            self._requests += 1
            self._error = str(error)
            since = self._since
            alert = not self._alerted and now - since >= ALERT_AFTER
            self._alerted = self._alerted or alert
            requests = self._requests
        self._notify("fallback", strategy)
        if alert:
            logger.error(
                "Redis has been unavailable for %.0f seconds (%s): %s requests without Redis "
                "so far: %d (handled by the db strategy, whose keys Redis does not see, or "
                "503 with REDIS_FAILURE_MODE 'fail_closed'). Run 'manage.py check --deploy' "
                "to test the Redis connection.",
                now - since,
                error,
                strategy,
                requests,
                extra={"idempotency_outcome": "redis_fallback_alert"},
            )

    def reached(self, strategy: str) -> None:
        """A request of ``strategy`` reached Redis: the episode, if any, is over."""
        if self._since is None:  # the hot path: one attribute read
            return
        with self._lock:
            since, self._since = self._since, None
            requests = self._requests
        if since is None:
            return
        self._notify("recovered", strategy)
        logger.warning(
            "Redis answers again after %.1f seconds (%d requests were handled without it)",
            time.monotonic() - since,
            requests,
        )

    def _notify(self, event: str, strategy: str) -> None:
        observer = self.observer
        if observer is None:
            return
        try:
            observer(event, strategy)
        except Exception:  # a metric must never fail a request
            logger.exception("could not record the Redis fallback")

    def snapshot(self) -> Health:
        with self._lock:
            since = self._since
            if since is None:
                return Health(True, None, 0.0, 0, "")
            seconds = time.monotonic() - since
            return Health(
                ok=seconds < ALERT_AFTER,
                redis_fallback_since=self._since_wall,
                redis_fallback_seconds=seconds,
                redis_fallback_requests=self._requests,
                redis_last_error=self._error,
            )

    def reset(self) -> None:
        """Forget the episode (tests)."""
        with self._lock:
            self._since = None
            self._requests, self._error, self._alerted = 0, "", False


monitor = FallbackMonitor()


def health() -> Health:
    """This process's view of Redis, for a health endpoint: ``ok`` is False while requests
    have been handled without Redis (the ``db`` fallback, or 503) for ``ALERT_AFTER``
    seconds or more. Cheap: no connection is made."""
    return monitor.snapshot()
