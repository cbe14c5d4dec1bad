"""HTTP servers a measure runs (gunicorn serving a project) and the requests it sends them."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .paths import ROOT
from .processes import free_port, stop_group


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def gunicorn_command(wsgi: str, workers: int, threads: int, *extra: str) -> list[str]:
    """gunicorn serving ``wsgi`` with gthread workers on the ``{port}`` ``serve`` fills in."""
    return [
        "gunicorn", wsgi, "--bind", "127.0.0.1:{port}", "--workers", str(workers),
        "--worker-class", "gthread", "--threads", str(threads), *extra,
    ]  # fmt: skip


@contextmanager
def serve(
    command: list[str],
    env: Mapping[str, str],
    *,
    ready_path: str,
    token: str,
    timeout: float = 60,
) -> Iterator[Server]:
    """``python -m <command>`` (``{port}`` in it: a free port) with ``env``, in a process
    group of its own; ready once ``GET ready_path`` with ``token`` answers 200; stopped
    afterwards."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="idem-bench-server-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", *(part.format(port=port) for part in command)],
        env=dict(env),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(f"http://127.0.0.1:{port}", process, Path(log.name))
    try:
        _wait_ready(server, ready_path, token, timeout)
        yield server
    finally:
        stop_group(process)
        log.close()
        Path(log.name).unlink(missing_ok=True)


def _wait_ready(server: Server, path: str, token: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.url}: the server exited:\n{server.log()}")
        try:
            if request(server.url + path, method="GET", token=token)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{server.url}: the server did not answer:\n{server.log()}")


def request(
    url: str,
    *,
    method: str = "POST",
    key: str | None = None,
    token: str | None = None,
    body: Any = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """One request (a JSON body, the token and the ``Idempotency-Key`` when given): the
    status and the parsed JSON (or text), a JSON object carrying the response's headers
    under ``"_headers"`` (lower-cased names)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    if key is not None:
        headers["Idempotency-Key"] = key
    payload = None if body is None else json.dumps(body).encode()
    try:
        conn.request(
            method, parts.path + (f"?{parts.query}" if parts.query else ""), payload, headers
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
