"""The example project under a real ASGI server (uvicorn), as ``example_server`` runs it
under gunicorn: a subprocess on a free port against a scratch database."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .example import ExampleServer, serve, server_settings


def uvicorn_command(workers: int) -> list[str]:
    """uvicorn serving ``example_project.asgi`` on the ``{port}`` that ``serve`` fills in."""
    return [
        "uvicorn",
        "example_project.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--workers",
        str(workers),
        "--lifespan",
        "off",
        "--no-access-log",
        "--timeout-graceful-shutdown",
        "5",
    ]


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
    command = uvicorn_command(workers)
    settings = {
        **server_settings(strategy, psp_delay_ms, lock_timeout, None),
        "DATABASE_CONN_MAX_AGE": "0",
        **(env or {}),
    }
    with serve("uvicorn", command, database_url, settings, ready_timeout) as server:
        yield server
