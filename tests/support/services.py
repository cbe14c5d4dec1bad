"""Where the test services are, and whether they must be there.

With ``CI`` set, a service that does not answer fails the tests that need it;
without ``CI``, those tests are skipped with the reason.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

POSTGRES_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
#: MariaDB for the ``mariadb`` alias (the tests create their own databases on it).
MARIADB_URL = os.environ.get("TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/idempotency")
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in {"", "0", "false", "no"}


def answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1
        ):
            return True
    except OSError:
        return False


def postgres_url() -> str | None:
    """The PostgreSQL URL for the tests, or None to test on SQLite only."""
    if os.environ.get("TEST_DATABASE", "").lower() == "sqlite" and not in_ci():
        return None
    if answers(POSTGRES_URL, 5432):
        return POSTGRES_URL
    if in_ci():
        raise RuntimeError(f"CI is set but PostgreSQL does not answer at {POSTGRES_URL}")
    return None


def mariadb_url() -> str | None:
    """The MariaDB URL for the ``mariadb`` alias: when it answers, and always when CI is set
    (so that a missing server fails the tests marked ``mariadb``); else None."""
    if in_ci() or answers(MARIADB_URL, 3306):
        return MARIADB_URL
    return None


def which(program: str) -> str | None:
    import shutil

    return shutil.which(program)


def chromium() -> str | None:
    """Debian's Chromium, for Playwright (its own browser download is not used)."""
    for name in ("chromium", "chromium-browser"):
        path = which(name)
        if path:
            return path
    return None


def redis_server_has_tls() -> bool:
    """Whether the installed ``redis-server`` was built with TLS: it accepts ``tls-port``
    and stops at the made-up directive after it (without TLS it stops at ``tls-port``)."""
    import subprocess

    server = which("redis-server")
    if server is None:
        return False
    result = subprocess.run(
        [server, "--tls-port", "0", "--port", "0", "--not-a-directive", "x"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    output = (result.stdout + result.stderr).lower()
    return "not-a-directive" in output and "tls-port" not in output
