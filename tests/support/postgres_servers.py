"""A private PostgreSQL server for tests that crash it.

``PrivatePostgres`` runs its own cluster (``initdb``) in a temporary directory on a free
loopback port, with the server's defaults for durability (``fsync`` on,
``synchronous_commit`` on). ``crash()`` is ``pg_ctl stop -m immediate``: every server
process exits at once, without a checkpoint, and the next ``start()`` runs crash recovery
from the WAL. ``wal_writer_paused()`` stops the WAL writer process (SIGSTOP) so that WAL
that no commit flushed itself stays in the server's memory, where a crash loses it (as a
power loss would lose WAL that had reached only the operating system's cache).

initdb refuses to run as root: as root, the cluster is made and run by the ``postgres``
OS user (``runuser``), in a directory handed to that user. The shared server on port 5432
is never touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .ports import free_port

#: Where Debian and Ubuntu put the server's programs (``initdb`` is not on PATH there).
DEBIAN_BINDIRS = ("/usr/lib/postgresql/15/bin",)

#: The cluster's settings besides the defaults: nothing else writes or flushes WAL behind
#: the test's back (no autovacuum, no background writer pages, no checkpoint by time).
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "40",
    "shared_buffers": "32MB",
    "autovacuum": "off",
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "1h",
    "max_wal_size": "1GB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}


def postgres_bindir() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres`` (``TEST_POSTGRES_BINDIR``
    when set, else where ``initdb`` is on PATH or Debian's), or None."""
    override = os.environ.get("TEST_POSTGRES_BINDIR")
    candidates: list[str] = []
    if override:
        candidates.append(override)
    else:
        found = shutil.which("initdb")
        if found:
            candidates.append(str(Path(found).parent))
        candidates += DEBIAN_BINDIRS
    for candidate in candidates:
        path = Path(candidate)
        if all((path / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return path
    return None


class PrivatePostgres:
    """One private PostgreSQL cluster; ``url(name)`` points at one of its databases."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = 0
        self.root: Path | None = None
        self._paused: int | None = None

    # -- paths and commands --------------------------------------------------------------

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *command: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *command]
        return list(command)

    def _run(self, program: str, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            self._as_owner(str(self.bindir / program), *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}\n{self.log()}"
            )
        return result.stdout

    def log(self) -> str:
        if self.root is None or not self.logfile.exists():
            return ""
        return self.logfile.read_text(errors="replace")

    # -- life ----------------------------------------------------------------------------

    def create(self) -> PrivatePostgres:
        """initdb a new cluster in a temporary directory."""
        self.root = Path(tempfile.mkdtemp(prefix="idem-pg-"))
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.root.chmod(0o700)
        self.port = free_port()
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"\nport = {self.port}\nunix_socket_directories = '{self.root}'\n")
            for name, value in SETTINGS.items():
                conf.write(f"{name} = {value}\n")
        return self

    def start(self) -> PrivatePostgres:
        """Start the server (after a crash: crash recovery first); wait until it answers."""
        self._run(
            "pg_ctl", "start", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60"
        )
        return self

    @property
    def running(self) -> bool:
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        return pid if _alive(pid) else None

    def crash(self, timeout: float = 30) -> None:
        """``pg_ctl stop -m immediate``: the server processes quit at once (no checkpoint,
        no flush); WAL in the server's memory is lost. Waits for the postmaster to exit."""
        pid = self.postmaster_pid()
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-W")
        if self._paused is not None:
            # The stopped WAL writer quits on the SIGQUIT it has been sent, as soon as it
            # runs again, before it can write anything.
            _wait(lambda: _sigquit_pending(self._paused), timeout, "the WAL writer's SIGQUIT")
            self._resume()
        if pid is not None:
            _wait(lambda: not _alive(pid), timeout, "the postmaster to exit")

    def stop(self) -> None:
        """A clean shutdown, if the server runs."""
        self._resume()
        if self.running:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60")

    def cleanup(self) -> None:
        """Stop the server (immediately, if a clean stop fails) and remove the cluster."""
        try:
            self.stop()
        except (RuntimeError, subprocess.SubprocessError):
            pid = self.postmaster_pid()
            if pid is not None:
                os.kill(pid, signal.SIGQUIT)  # the postmaster this object started
                _wait(lambda: not _alive(pid), 30, "the postmaster to exit")
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    # -- the WAL writer --------------------------------------------------------------------

    def wal_writer_pid(self) -> int:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            ).fetchone()
        assert row is not None, "the server has no WAL writer"
        return int(row[0])

    @contextmanager
    def wal_writer_paused(self) -> Iterator[int]:
        """The WAL writer stopped (SIGSTOP) for the block: an asynchronous commit's WAL is
        then written and flushed only by a later commit that flushes its own. Yields the
        WAL writer's pid; resumed at the end (a crash inside the block ends it)."""
        pid = self.wal_writer_pid()
        os.kill(pid, signal.SIGSTOP)
        self._paused = pid
        try:
            yield pid
        finally:
            self._resume()

    def _resume(self) -> None:
        pid, self._paused = self._paused, None
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGCONT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _state(pid).startswith("Z")


def _state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split(None, 1)[1]
    except OSError:
        pass
    return ""


def _sigquit_pending(pid: int | None) -> bool:
    """Whether SIGQUIT is pending for ``pid`` (or it is gone already)."""
    if pid is None:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    mask = 1 << (signal.SIGQUIT - 1)
    for line in status.splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & mask:
            return True
    return False


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)
