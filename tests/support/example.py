"""The example project for end-to-end tests: real servers, real races.

``scratch_database`` makes a fresh, migrated and seeded database (PostgreSQL, MariaDB or
SQLite); ``example_server`` runs the example payments API under gunicorn against
it; ``race`` fires many requests at one moment from real threads, ``split_race``
and ``race_summary`` sort what they got back, and ``assert_one_execution`` checks that
the view ran once.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .databases import pg_admin, with_database
from .ports import free_port
from .services import MARIADB_URL, POSTGRES_URL
from .threads import run_at_once

ROOT = Path(__file__).resolve().parents[2]


def example_env(database_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "IDEMPOTENCY_", "REDIS_", "CELERY_", "PSP_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DATABASE_URL=database_url,
        EXAMPLE_BASELINE_ROUTES="1",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra or {})
    return env


def manage(database_url: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=example_env(database_url, env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


#: The migrated and seeded databases that :func:`scratch_database` copies, by kind and
#: server, each made on its first use in this process: a copy (PostgreSQL's ``CREATE
#: DATABASE ... TEMPLATE``, a SQLite file's bytes) takes a fraction of a second, where
#: ``migrate`` and ``seed_demo`` are two Django processes and seconds of CPU each time.
#: ``drop_templates`` removes them (the session fixture ``_scratch_templates``).
_templates: dict[tuple[str, str], str] = {}


def _migrate_and_seed(url: str) -> None:
    manage(url, "migrate", "--noinput", "-v", "0")
    manage(url, "seed_demo")


def _postgres_template(admin_url: str) -> str:
    """The name of this process's migrated and seeded PostgreSQL database on the server of
    ``admin_url``, made if there is none yet. No one stays connected to it: ``CREATE
    DATABASE ... TEMPLATE`` needs it alone."""
    name = _templates.get(("postgres", admin_url))
    if name is None:
        name = f"idem_template_{uuid.uuid4().hex[:12]}"
        pg_admin(f'CREATE DATABASE "{name}"', admin_url)
        try:
            _migrate_and_seed(with_database(admin_url, name))
        except BaseException:
            pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url)
            raise
        _templates["postgres", admin_url] = name
    return name


def _sqlite_template() -> str:
    """The path of this process's migrated and seeded SQLite file, made if there is none."""
    path = _templates.get(("sqlite", ""))
    if path is None:
        path = tempfile.mkdtemp(prefix="idem-template-") + "/db.sqlite3"
        try:
            _migrate_and_seed(f"sqlite:///{path}")
        except BaseException:
            shutil.rmtree(Path(path).parent, ignore_errors=True)
            raise
        _templates["sqlite", ""] = path
    return path


def _copy_sqlite(source: str, target: str) -> None:
    """``source``'s database into a new file ``target``, through SQLite's backup (which
    reads what the write-ahead log holds too)."""
    with closing(sqlite3.connect(source)) as old, closing(sqlite3.connect(target)) as new:
        old.backup(new)


def drop_templates() -> None:
    """Remove the databases :func:`scratch_database` copied from."""
    while _templates:
        (kind, admin_url), name = _templates.popitem()
        if kind == "postgres":
            pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url)
        else:
            shutil.rmtree(Path(name).parent, ignore_errors=True)


@contextmanager
def scratch_database(
    kind: str, *, admin_url: str = POSTGRES_URL, prefix: str = "idem_scratch_"
) -> Iterator[str]:
    """A new database with the example project migrated and seeded; dropped afterwards.

    ``kind`` is "postgres" (created through ``admin_url``, named ``prefix`` + a random
    suffix, as a copy of :func:`_postgres_template`'s), "mariadb" (on the server of
    ``MARIADB_URL``, named alike, migrated and seeded anew) or "sqlite" (a copy of
    :func:`_sqlite_template`'s file in a temporary directory)."""
    if kind == "postgres":
        template = _postgres_template(admin_url)
        name = f"{prefix}{uuid.uuid4().hex[:12]}"
        pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"', admin_url)
        try:
            yield with_database(admin_url, name)
        finally:
            pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url)
    elif kind == "mariadb":
        from .mariadb import mysql_admin

        name = f"{prefix}{uuid.uuid4().hex[:12]}"
        mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        url = with_database(MARIADB_URL, name)
        try:
            _migrate_and_seed(url)
            yield url
        finally:
            mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
    elif kind == "sqlite":
        template = _sqlite_template()
        with tempfile.TemporaryDirectory(prefix="idem-scratch-") as tmp:
            _copy_sqlite(template, f"{tmp}/db.sqlite3")
            yield f"sqlite:///{tmp}/db.sqlite3"
    else:  # pragma: no cover
        raise ValueError(kind)


@dataclass
class ExampleServer:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(pid) for pid in out.split()]


@contextmanager
def serve(
    name: str,
    command: list[str],
    database_url: str,
    settings: Mapping[str, str],
    ready_timeout: float = 30,
    *,
    ready_path: str = "/api/charges/",
    ready_token: str = "alice-token",
) -> Iterator[ExampleServer]:
    """Run ``command`` (a server of the example project, with ``{port}`` in it for a free
    port) against ``database_url`` with the example's environment plus ``settings``; stop
    its whole process group afterwards. It is ready once ``GET ready_path`` with
    ``ready_token`` answers 200 (``settings`` may name another project)."""
    port = free_port()
    server_env = example_env(database_url, settings)
    log = tempfile.NamedTemporaryFile(prefix=f"idem-{name}-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", *(part.format(port=port) for part in command)],
        env=server_env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = ExampleServer(f"http://127.0.0.1:{port}", port, process, Path(log.name), server_env)
    try:
        _wait_ready(server, ready_timeout, name, ready_path, ready_token)
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


@dataclass
class Refusal:
    """What a server that must refuse to start did: its exit code (None: still running at
    the deadline, then killed), its log, and every HTTP status it answered meanwhile."""

    returncode: int | None
    log: str
    answers: list[int]


def refused_start(
    name: str,
    command: list[str],
    database_url: str,
    settings: Mapping[str, str],
    timeout: float = 60,
) -> Refusal:
    """Run ``command`` as ``serve`` does, and send it requests (a GET and a POST with an
    Idempotency-Key, in turn) until it exits or ``timeout`` passes; then stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/charges/"
    with tempfile.NamedTemporaryFile(prefix=f"idem-{name}-", suffix=".log") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *(part.format(port=port) for part in command)],
            env=example_env(database_url, settings),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        answers: list[int] = []
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                method, key = ("POST", "refused-key") if len(answers) % 2 else ("GET", None)
                try:
                    status, _ = request(url, method=method, key=key, body={}, timeout=2)
                except (OSError, http.client.HTTPException):
                    time.sleep(0.05)
                    continue
                answers.append(status)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
                returncode = None
            else:
                returncode = process.returncode
        return Refusal(returncode, Path(log.name).read_text(errors="replace"), answers)


def server_settings(
    strategy: str, psp_delay_ms: int, lock_timeout: float, env: Mapping[str, str] | None
) -> dict[str, str]:
    """The example's environment for one test server."""
    return {
        "IDEMPOTENCY_STRATEGY": strategy,
        "PSP_DELAY_MS": str(psp_delay_ms),
        "IDEMPOTENCY_LOCK_TIMEOUT": str(lock_timeout),
        **(env or {}),
    }


def gunicorn_command(wsgi: str, workers: int, threads: int) -> list[str]:
    """gunicorn serving ``wsgi`` with gthread workers, on the ``{port}`` that ``serve``
    fills in."""
    return [
        "gunicorn",
        wsgi,
        "--bind",
        "127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        "gthread",
        "--threads",
        str(threads),
    ]


@contextmanager
def example_server(
    database_url: str,
    *,
    strategy: str = "db",
    psp_delay_ms: int = 0,
    lock_timeout: float = 60,
    workers: int = 3,
    threads: int = 8,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    ready_timeout: float = 30,
) -> Iterator[ExampleServer]:
    """The example payments API under gunicorn (gthread workers) on a free port.

    ``timeout`` is gunicorn's worker timeout; ``ready_timeout`` how long to wait for the
    first answer. The application is loaded once, in the arbiter, and its workers are forks
    of it (``--preload``): a worker costs no import of its own, at its start or when a test
    has killed one (``tests/system/test_startup.py`` starts workers that load it
    themselves)."""
    command = [
        *gunicorn_command("example_project.wsgi", workers, threads),
        "--preload",
        "--timeout",
        str(int(timeout)),
        "--graceful-timeout",
        "5",
        "--no-control-socket",
    ]
    settings = server_settings(strategy, psp_delay_ms, lock_timeout, env)
    with serve("gunicorn", command, database_url, settings, ready_timeout) as server:
        yield server


def _wait_ready(
    server: ExampleServer,
    seconds: float = 30,
    name: str = "gunicorn",
    path: str = "/api/charges/",
    token: str = "alice-token",
) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{name} exited:\n" + server.log())
        try:
            status, _ = request(server.url + path, method="GET", token=token)
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer:\n" + server.log())


def request(
    url: str,
    *,
    method: str = "POST",
    key: str | None = None,
    token: str | None = "alice-token",
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """One HTTP request; returns (status, parsed JSON or raw text) and keeps response headers
    in the returned body under ``"_headers"`` when it is a JSON object."""
    parts = urlsplit(url)
    assert parts.hostname is not None, url
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    send_headers = {"Content-Type": "application/json", **(headers or {})}
    if token:
        send_headers["Authorization"] = f"Token {token}"
    if key is not None:
        send_headers["Idempotency-Key"] = key
    payload = None if body is None else json.dumps(body).encode()
    try:
        conn.request(
            method, parts.path + (f"?{parts.query}" if parts.query else ""), payload, send_headers
        )
        response = conn.getresponse()
        raw = response.read()
        try:
            data: Any = json.loads(raw)
        except ValueError:
            data = raw.decode(errors="replace")
        if isinstance(data, dict):
            data["_headers"] = {k.lower(): v for k, v in response.getheaders()}
        return response.status, data
    finally:
        conn.close()


def race(
    url: str,
    *,
    n: int = 20,
    key: str | None = "race-key",
    token: str = "alice-token",
    body: Any = None,
    stagger: float = 0.0,
) -> list[tuple[int, Any]]:
    """``n`` threads send the same request at the same moment (a barrier releases them);
    the answers in thread order. A client that fails is re-raised after all have finished."""

    def client(index: int) -> tuple[int, Any]:
        if stagger:
            time.sleep(stagger * index)
        return request(url, key=key, token=token, body=body)

    return run_at_once(n, client, timeout=120)


def is_replay(result: tuple[int, Any]) -> bool:
    """Whether one ``request()`` result was answered with ``Idempotent-Replayed: true``."""
    _status, body = result
    return isinstance(body, dict) and body["_headers"].get("idempotent-replayed") == "true"


def race_summary(results: list[tuple[int, Any]]) -> Counter[str]:
    """How many of each answer: "201", "201 replay", "409"..."""
    return Counter(
        f"{status}{' replay' if is_replay((status, body)) else ''}" for status, body in results
    )


def split_race(
    results: list[tuple[int, Any]],
) -> tuple[list[Any], list[Any], list[Any]]:
    """The bodies of the fresh 201s, of the replayed 201s, and of the 409s."""
    fresh = [b for s, b in results if s == 201 and not is_replay((s, b))]
    replays = [b for s, b in results if s == 201 and is_replay((s, b))]
    conflicts = [b for s, b in results if s == 409]
    return fresh, replays, conflicts


def assert_one_execution(results: list[tuple[int, Any]], n: int) -> list[Any]:
    """A race of ``n`` requests ran the view once: one fresh 201, and every other answer a
    replay of it or a 409. Returns the fresh bodies (a list of one)."""
    fresh, replays, conflicts = split_race(results)
    assert len(fresh) == 1, [s for s, _ in results]
    assert len(fresh) + len(replays) + len(conflicts) == n
    assert all(b["id"] == fresh[0]["id"] for b in replays)
    return fresh
