"""A gunicorn worker that kills itself (SIGKILL) at a precise point of the protocol.

:func:`kill_hook` writes a gunicorn config file (``GUNICORN_CMD_ARGS="--config <file>"``)
whose ``post_worker_init`` wraps one method of the library in the worker: while the flag
file named by ``KILL_FLAG`` exists, the worker deletes it and sends itself SIGKILL there,
before the method runs or just after it returned. The worker dies as a ``kill -9`` or an
OOM kill would: its transaction rolls back with its connection, its heartbeat stops, its
Redis commands stop. One flag, one death: the worker gunicorn starts in its place serves
the retry.
"""

from __future__ import annotations

from pathlib import Path

HOOK = """
import importlib
import os
import signal
from pathlib import Path

FLAG = Path(os.environ["KILL_FLAG"])


def post_worker_init(worker):
    owner = getattr(importlib.import_module({module!r}), {owner!r})
    method = getattr(owner, {method!r})

    def killed(self, *args, **kwargs):
        if {after!r}:
            result = method(self, *args, **kwargs)
        if FLAG.exists():
            FLAG.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        if not {after!r}:
            return method(self, *args, **kwargs)
        return result

    setattr(owner, {method!r}, killed)
"""


def kill_hook(directory: Path, target: str, *, after: bool = False) -> dict[str, str]:
    """The environment of an example server whose worker is killed at ``target``
    (``"module.Class.method"``, the module relative to the package), before that method
    runs, or with ``after`` once it returned; armed by touching ``directory / "kill"``."""
    module, owner, method = target.rsplit(".", 2)
    hook = directory / "kill_hook.py"
    hook.write_text(
        HOOK.format(module="django_idempotency." + module, owner=owner, method=method, after=after)
    )
    return {"KILL_FLAG": str(directory / "kill"), "GUNICORN_CMD_ARGS": f"--config {hook}"}


def in_progress(client: object) -> int:
    """How many in-progress records a ``redis.Redis`` client's server holds."""
    values = [client.get(name) for name in client.scan_iter(match="*:rec")]  # type: ignore[attr-defined]
    return sum(1 for v in values if isinstance(v, bytes) and v.startswith(b'{"s":"in_progress"'))
