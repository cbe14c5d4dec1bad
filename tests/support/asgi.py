"""The example project under a real ASGI server (uvicorn), as ``example_server`` runs it
under gunicorn: a subprocess on a free port against a scratch database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .example import ROOT, ExampleServer, _wait_ready, example_env
from .ports import free_port


@contextmanager
def uvicorn_server(
    database_url: str,
    *,
    strategy: str = "db",
    psp_delay_ms: int = 0,
    lock_timeout: float = 60,
    workers: int = 2,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 30,
) -> Iterator[ExampleServer]:
    """``example_project.asgi`` under uvicorn with ``workers`` processes, each one event
    loop. Persistent database connections are off, as Django advises under ASGI (each
    request's database work runs in a thread of its own)."""
    port = free_port()
    server_env = example_env(
        database_url,
        {
            "IDEMPOTENCY_STRATEGY": strategy,
            "PSP_DELAY_MS": str(psp_delay_ms),
            "IDEMPOTENCY_LOCK_TIMEOUT": str(lock_timeout),
            "DATABASE_CONN_MAX_AGE": "0",
            **(env or {}),
        },
    )
    log = tempfile.NamedTemporaryFile(prefix="idem-uvicorn-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "example_project.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--lifespan",
            "off",
            "--no-access-log",
            "--timeout-graceful-shutdown",
            "5",
        ],
        env=server_env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = ExampleServer(f"http://127.0.0.1:{port}", port, process, Path(log.name), server_env)
    try:
        _wait_ready(server, ready_timeout)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        log.close()
        os.unlink(log.name)
