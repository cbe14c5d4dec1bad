"""A private PgBouncer for tests of what the library leaves on pooled server connections.

``PrivatePgBouncer`` runs ``pgbouncer`` (Debian's package) in the foreground on a free
loopback port and in a Unix-domain socket directory of its own, with its own ini, in
front of a PostgreSQL server (the shared one on 5432 by default). Every database name
is passed through to that server as the ``postgres`` user (``auth_type = any``), in
``pool_mode = transaction`` with ``pool_size`` server connections per database: with
one, every client gets the same server connection, so that whatever session state one
request leaves there the next client sees. The Debian service is never used.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .ports import free_port


def pgbouncer_binary() -> str | None:
    """``pgbouncer`` on PATH, or Debian's in /usr/sbin (not on a user's PATH)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


class PrivatePgBouncer:
    """One pgbouncer process; ``url(name)`` reaches database ``name`` through it."""

    def __init__(
        self, *, upstream_host: str = "127.0.0.1", upstream_port: int = 5432, pool_size: int = 1
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.pool_size = pool_size
        self.port = 0
        self.root: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket_dir(self) -> str:
        assert self.root is not None
        return str(self.root)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def ini(self) -> str:
        host, port = self.upstream
        return "\n".join(
            [
                "[databases]",
                f"* = host={host} port={port} user=postgres",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                f"unix_socket_dir = {self.socket_dir}",
                "auth_type = any",
                "pool_mode = transaction",
                f"default_pool_size = {self.pool_size}",
                "min_pool_size = 0",
                "reserve_pool_size = 0",
                "max_client_conn = 200",
                f"logfile = {self.socket_dir}/pgbouncer.log",
                f"pidfile = {self.socket_dir}/pgbouncer.pid",
                "admin_users = postgres",
                "",
            ]
        )

    def log(self) -> str:
        if self.root is None:
            return ""
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 30) -> PrivatePgBouncer:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (make test installs it)")
        self.root = Path(tempfile.mkdtemp(prefix="idem-pgbouncer-"))
        self.port = free_port()
        ini = self.root / "pgbouncer.ini"
        ini.write_text(self.ini())
        command = [binary, str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            owner = pwd.getpwnam("postgres")
            for path in (self.root, ini):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            command = [binary, "-u", "postgres", str(ini)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_until_it_answers(timeout)
        return self

    def _wait_until_it_answers(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited:\n{self.log()}")
            try:
                with psycopg.connect(self.url("pgbouncer"), autocommit=True) as conn:
                    conn.execute("SHOW VERSION")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer does not answer:\n{self.log()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the process this object started and remove its directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # a fast shutdown
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
