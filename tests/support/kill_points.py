"""Kill the process that runs a charge in steps where a flag file says: the crash tests'
hook, installed in a real gunicorn worker (``post_worker_init``) or a real Celery worker
(``celery worker --include tests.support.kill_points``).

``STEPS_KILL_FLAG`` names the file; when it holds the point reached, the file is removed
and the process sends itself ``SIGKILL``. The points: ``before:<step>`` (after the step
before it committed), ``after:<step>``, and ``provider:before`` / ``provider:after``
around the fake provider's call inside the remote step.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Where a charge in four steps (example_project.payments.charging) can be killed, in order.
POINTS = (
    "before:create_charge",
    "before:call_provider",
    "provider:before",
    "provider:after",
    "before:record_answer",
    "before:send_receipt",
    "after:send_receipt",
)


def kill_at(point: str) -> None:
    """SIGKILL this process if the flag file names ``point`` (removing the flag first)."""
    flag = Path(os.environ["STEPS_KILL_FLAG"])
    try:
        if flag.read_text() != point:
            return
    except FileNotFoundError:
        return
    flag.unlink()
    os.kill(os.getpid(), signal.SIGKILL)


def _around_step(method: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: Any, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kill_at("before:" + name)
        result = method(self, name, fn, *args, **kwargs)
        kill_at("after:" + name)
        return result

    return step


def install() -> None:
    """Wrap ``Steps.local``, ``Steps.remote`` and the fake provider's call in this
    process."""
    from django_idempotency.protocol.steps import Steps
    from example_project.payments import psp

    Steps.local = _around_step(Steps.local)  # type: ignore[method-assign]
    Steps.remote = _around_step(Steps.remote)  # type: ignore[method-assign]
    charge = psp.charge

    def killed_charge(*args: Any, **kwargs: Any) -> str:
        kill_at("provider:before")
        result = charge(*args, **kwargs)
        kill_at("provider:after")
        return result

    psp.charge = killed_charge


if os.environ.get("STEPS_KILL_CELERY"):  # imported by a Celery worker's --include
    install()
