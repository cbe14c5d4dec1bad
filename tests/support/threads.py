"""Real threads for races and for requests that run while a test does something else.

``run_at_once(n, work)`` runs ``work(0)`` … ``work(n - 1)`` on ``n`` threads that a
barrier releases together, and returns their results in thread order;
``in_background(work)`` runs ``work()`` on one thread and hands back a handle whose
``result()`` joins it.

Each thread closes its own Django database connections when its work is done (Django's
connections are per thread, so each thread really has its own). An error in a thread is
re-raised by the call that collects the results, after the join; a thread that does not
finish in time is a failure.

Django is imported only when a thread finishes, and only if it is installed and
configured, so that this works without settings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

BARRIER_TIMEOUT = 30.0  # how long a thread waits for the others to start


def close_django_connections() -> None:
    """Close the calling thread's Django connections, if Django is set up."""
    try:
        from django.conf import settings
        from django.db import connections
    except ImportError:  # pragma: no cover - Django is a dependency of the tests
        return
    if settings.configured:
        connections.close_all()


class _Outcome(Generic[T]):
    """What one thread's work returned or raised."""

    def __init__(self) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self, work: Callable[[], T]) -> None:
        try:
            self.value = work()
        except BaseException as exc:  # re-raised by the collector, after the join
            self.error = exc
        finally:
            close_django_connections()


def _reraise(errors: list[BaseException], n: int) -> None:
    """Raise the first error (in thread order), noting how many threads failed."""
    if errors:
        first = errors[0]
        first.add_note(f"{len(errors)} of {n} threads failed; this is the first: {errors!r}")
        raise first


def run_at_once(n: int, work: Callable[[int], T], *, timeout: float = 120.0) -> list[T]:
    """Run ``work(i)`` for ``i`` in ``range(n)`` on ``n`` threads released together by a
    barrier; return the results in thread order.

    Every thread closes its Django connections when done. Fails if a thread is still
    running ``timeout`` seconds after the start, and re-raises the first error a thread
    raised (after all have been joined).
    """
    barrier = threading.Barrier(n)
    outcomes: list[_Outcome[T]] = [_Outcome() for _ in range(n)]

    def target(index: int) -> None:
        def released() -> T:
            barrier.wait(timeout=BARRIER_TIMEOUT)
            return work(index)

        outcomes[index].run(released)

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"threads {hung} of {n} hung for more than {timeout} s"
    _reraise([o.error for o in outcomes if o.error is not None], n)
    return [o.value for o in outcomes]  # type: ignore[misc]  # every one is done


class InBackground(Generic[T]):
    """``work()`` running on its own thread; ``result()`` joins it and returns its value."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._outcome: _Outcome[T] = _Outcome()
        self.thread = threading.Thread(target=self._outcome.run, args=(work,), daemon=True)
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def result(self, timeout: float = 60.0) -> T:
        """Join the thread; fail if it is still running after ``timeout`` seconds,
        re-raise what it raised, or return what it returned."""
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive(), f"the background work hung for more than {timeout} s"
        _reraise([self._outcome.error] if self._outcome.error is not None else [], 1)
        return self._outcome.value  # type: ignore[return-value]  # it is done


def in_background(work: Callable[[], T]) -> InBackground[T]:
    """Start ``work()`` on its own thread (so: its own database connections) and return
    the handle; ``handle.result(timeout)`` waits for it."""
    return InBackground(work)
