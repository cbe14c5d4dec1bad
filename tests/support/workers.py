"""Real Celery worker processes, and removing what a test's Celery traffic left on Redis.

``Worker`` runs one ``celery -A example_project.celery worker`` (solo pool) as a
process group of its own, logging to a file that its methods read back.

Kombu's Redis transport keeps a queue as a list named after it, its bindings under
``_kombu.binding.<queue>`` / ``_kombu.binding_permanent.<queue>``, and messages a
worker received but had not acknowledged (a worker killed with SIGKILL) in the
``unacked`` hash and ``unacked_index`` sorted set, from where it would put them back
on the queue later. ``delete_queue`` removes only the entries of the given queue.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from . import services

ROOT = Path(__file__).resolve().parents[2]
DRAINED = re.compile(r"drained (\d+) outbox rows \((\d+) expired\) in (\d+) transactions")


@dataclass
class Worker:
    """One ``celery worker`` subprocess (solo pool: the task runs in this very process).

    ``queue``: consume only that queue (else the default one); ``prefetch_multiplier``:
    Celery's ``--prefetch-multiplier`` (else Celery's default); ``include``: modules the
    worker imports at start-up (``--include``)."""

    name: str
    env: dict[str, str]
    log_path: Path
    queue: str | None = None
    prefetch_multiplier: int | None = None
    include: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    def start(self, timeout: float = 60) -> Worker:
        options = ["--queues", self.queue] if self.queue else []
        if self.prefetch_multiplier is not None:
            options += ["--prefetch-multiplier", str(self.prefetch_multiplier)]
        if self.include:
            options += ["--include", ",".join(self.include)]
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project.celery",
                "worker",
                "--pool",
                "solo",
                "--loglevel",
                "INFO",
                "--hostname",
                f"{self.name}@%h",
                *options,
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        starts = self.log().count(" ready.")
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited:\n{self.log()}")
            if self.log().count(" ready.") > starts:
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"celery worker did not start:\n{self.log()}")

    def exited(self) -> bool:
        """Whether the worker process has ended (it was started and is gone)."""
        return self.process is not None and self.process.poll() is not None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def drained(self) -> int:
        """Rows this worker's drains reported, over all its runs."""
        return sum(int(m.group(1)) for m in DRAINED.finditer(self.log()))

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a lost machine would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


def worker_env(database: str, broker: str, **extra: str) -> dict[str, str]:
    """The environment of a worker on the test database ``database`` and the broker
    ``broker``: this process's, without its Celery and Django settings, and ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DJANGO_", "TEST_CEL"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        TEST_DATABASE_NAME=database,
        TEST_CELERY_BROKER_URL=broker,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


@contextmanager
def worker_pool(env: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    """``start(name, queue, include=(), **extra)`` starts a worker (one task at a time) on
    ``queue`` with ``env`` and ``extra``; every worker started is stopped at the end."""
    started: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="idem-celery-") as tmp:

        def start(name: str, queue: str, include: tuple[str, ...] = (), **extra: str) -> Worker:
            worker = Worker(
                name=f"{name}-{uuid.uuid4().hex[:6]}",
                queue=queue,
                prefetch_multiplier=1,
                include=include,
                env={**env, "TEST_CELERY_QUEUE": queue, **extra},
                log_path=Path(tmp) / f"{name}.log",
            )
            started.append(worker)
            return worker.start()

        try:
            yield start
        finally:
            for worker in started:
                worker.stop()


def delete_queue(name: str, url: str = services.REDIS_URL) -> None:
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
        for tag, raw in client.hgetall("unacked").items():
            try:
                _message, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if routing_key == name:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    except redis.RedisError:
        pass
    finally:
        client.close()
