"""The PostgreSQL a measure uses: scratch databases made through the admin URL, dropped after,
or a private cluster of its own.

``BENCH_DATABASE_URL`` names the server and an admin database (default: user ``postgres`` on
127.0.0.1:5432, database ``postgres``); a measure never touches a database it did not make.
``private_server()`` runs a cluster of the measure's own, with the settings it chooses, for
counters that are the whole server's (WAL bytes, full-page images, checkpoints).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def admin(sql: str, admin_url: str | None = None) -> None:
    """One statement in autocommit on the admin database (``CREATE DATABASE``...)."""
    import psycopg

    with psycopg.connect(admin_url or ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


def url_of(name: str, admin_url: str | None = None) -> str:
    """The URL of the database ``name`` on the admin URL's server."""
    return urlsplit(admin_url or ADMIN_URL)._replace(path="/" + name).geturl()


@contextmanager
def scratch_database(prefix: str = "idem_bench_", admin_url: str | None = None) -> Iterator[str]:
    """A new, empty database (``prefix`` + a random suffix) on the server of ``admin_url``
    (default: ``BENCH_DATABASE_URL``); its URL; dropped afterwards, with whatever is still
    connected to it."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin(f'CREATE DATABASE "{name}"', admin_url)
    try:
        yield url_of(name, admin_url)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url)


def django_database(url: str) -> dict[str, Any]:
    """Django's ``DATABASES`` entry for the PostgreSQL database at ``url``, with persistent
    connections (``CONN_MAX_AGE = None``)."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "CONN_MAX_AGE": None,
    }


def scalar(url: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """One value from the database at ``url``."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


#: Where Debian and Ubuntu put the server's programs (``initdb`` is not on PATH there).
DEBIAN_BINDIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin",
                  "/usr/lib/postgresql/15/bin")  # fmt: skip


def server_bindir() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``pg_waldump`` (``BENCH_POSTGRES_BINDIR``,
    else where ``initdb`` is on PATH, else Debian's), or None."""
    override = os.environ.get("BENCH_POSTGRES_BINDIR")
    found = shutil.which("initdb")
    candidates = [override] if override else [*([str(Path(found).parent)] if found else []),
                                               *DEBIAN_BINDIRS]  # fmt: skip
    for candidate in candidates:
        path = Path(candidate)
        if all((path / name).is_file() for name in ("initdb", "pg_ctl", "pg_waldump")):
            return path
    return None


def _as_owner(*command: str) -> list[str]:
    """``command`` as the ``postgres`` OS user when run as root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


@dataclass(frozen=True)
class PrivateServer:
    """A private cluster: its admin URL, its data directory and its programs."""

    url: str
    data: Path
    bindir: Path

    def database_url(self, name: str) -> str:
        return urlsplit(self.url)._replace(path="/" + name).geturl()


@contextmanager
def private_server(settings: Mapping[str, str]) -> Iterator[PrivateServer]:
    """A PostgreSQL cluster of its own (``initdb`` in a temporary directory, on a free
    loopback port) with ``settings`` added to its ``postgresql.conf``, for a measure whose
    counters are cluster-wide (WAL, checkpoints); stopped and removed afterwards. The
    shared server is never touched."""
    from .processes import free_port

    bindir = server_bindir()
    if bindir is None:
        raise RuntimeError("no initdb/pg_ctl/pg_waldump found (set BENCH_POSTGRES_BINDIR)")
    root = Path(tempfile.mkdtemp(prefix="idem-bench-pg-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    root.chmod(0o700)
    data, port = root / "data", free_port()

    def run(program: str, *args: str) -> None:
        subprocess.run(_as_owner(str(bindir / program), *args), check=True,
                       capture_output=True, timeout=300)  # fmt: skip

    try:
        run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-instructions")  # fmt: skip
        lines = [f"port = {port}", "listen_addresses = '127.0.0.1'",
                 f"unix_socket_directories = '{root}'",
                 *(f"{name} = {value}" for name, value in settings.items())]  # fmt: skip
        with (data / "postgresql.conf").open("a") as conf:
            conf.write("\n" + "\n".join(lines) + "\n")
        run("pg_ctl", "start", "-D", str(data), "-l", str(root / "server.log"), "-w")
        try:
            yield PrivateServer(f"postgres://postgres@127.0.0.1:{port}/postgres", data, bindir)
        finally:
            run("pg_ctl", "stop", "-D", str(data), "-m", "fast", "-w")
    finally:
        shutil.rmtree(root, ignore_errors=True)
