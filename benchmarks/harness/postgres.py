"""The PostgreSQL a measure uses: scratch databases made through the admin URL, dropped after,
and a private server for a measure that counts the server's own work (WAL bytes).

``BENCH_DATABASE_URL`` names the server and an admin database (default: user ``postgres`` on
127.0.0.1:5432, database ``postgres``); a measure never touches a database it did not make.
``private_server()`` runs a cluster of its own (``initdb``, as the ``postgres`` OS user when
run as root) on a free loopback port, where no other client writes WAL, and removes it after.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .processes import free_port

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


#: Where Debian puts the server's programs (``initdb`` is not on PATH there), one directory
#: per major version.
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"


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


def bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (``BENCH_POSTGRES_BINDIR``, PATH or
    Debian's), None without one."""
    found = shutil.which("initdb")
    candidates = [os.environ.get("BENCH_POSTGRES_BINDIR", "")]
    candidates += [str(Path(found).parent)] if found else []
    debian = sorted(glob.glob(DEBIAN_BINDIRS), reverse=True)  # the newest version first
    for candidate in [*candidates, *debian]:
        if candidate and all((Path(candidate) / p).is_file() for p in ("initdb", "pg_ctl")):
            return Path(candidate)
    return None


def _as_owner(*command: str) -> list[str]:
    """``command`` as the ``postgres`` OS user when run as root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


@contextmanager
def private_server(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A PostgreSQL cluster of its own on a free loopback port (trust authentication, the
    server's defaults plus ``settings``, each a ``postgresql.conf`` value); its admin URL.
    Stopped and removed afterwards."""
    programs = bindir()
    if programs is None:
        raise RuntimeError("no initdb: set BENCH_POSTGRES_BINDIR")
    root = Path(tempfile.mkdtemp(prefix="idem-bench-pg-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, port = root / "data", free_port()
    ctl = str(programs / "pg_ctl")
    try:
        initdb = [str(programs / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
        initdb += ["-E", "UTF8", "--locale=C", "--no-instructions"]
        subprocess.run(_as_owner(*initdb), check=True, capture_output=True)
        conf = {"listen_addresses": "'127.0.0.1'", "port": str(port), **(settings or {})}
        conf["unix_socket_directories"] = f"'{root}'"
        with (data / "postgresql.conf").open("a") as file:
            file.writelines(f"{name} = {value}\n" for name, value in conf.items())
        start = [ctl, "start", "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60"]
        subprocess.run(_as_owner(*start), check=True, capture_output=True)
        yield f"postgres://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            stop = [ctl, "stop", "-D", str(data), "-m", "fast", "-w", "-t", "60"]
            subprocess.run(_as_owner(*stop), check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


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
