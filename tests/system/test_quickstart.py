"""The quick start's shell commands, as written in README.md and docs/quickstart.md, run by
bash against the example project served on a free port (never 8000): the curls follow
``PORT`` and answer what their comments say.

The example is served as ``make run`` serves it (gunicorn, SQLite, migrated and seeded with
the demo users), once as it is and once with ``PSP_DELAY_MS=3000`` for the ``409`` block.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.example import ROOT, ExampleServer, example_server, scratch_database

PAGES = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]


def bash_blocks(page: Path) -> list[str]:
    """The page's ``bash`` code blocks that send requests to the example with curl, in
    order (not the ones that show a request to ``api.example.com``)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
    return [block for block in blocks if "curl " in block and "127.0.0.1" in block]


def test_no_block_sends_to_the_example_on_a_port_of_its_own() -> None:
    """The example is only ever reached through ``$BASE`` (which follows ``PORT``)."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "curl" in text
        assert not re.findall(r"curl [^\n]*127\.0\.0\.1", text), page


def run(block: str, port: int, path: str = "") -> str:
    """``block`` run by bash with ``PORT`` set (as the reader exported it), at the start of
    a second of its own (the blocks name their keys after the clock's second); its output.
    ``path``: a directory searched for commands first."""
    time.sleep(1.05 - time.time() % 1)
    curl = shutil.which("curl")
    assert curl is not None, "the quick start needs curl"
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env={"PATH": os.pathsep.join(filter(None, [path, os.environ["PATH"]])), "PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def statuses(output: str) -> list[int]:
    """The status of each response in ``curl -i``'s output (a body need not end its line)."""
    return [int(code) for code in re.findall(r"HTTP/1\.1 (\d{3}) ", output)]


def headers_named(output: str, name: str) -> list[str]:
    return re.findall(rf"^{name}: *(.*?)\r?$", output, re.M | re.I)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with scratch_database("sqlite") as url:
        yield url


@pytest.fixture(scope="module")
def server(database: str) -> Iterator[ExampleServer]:
    with example_server(database, workers=1, threads=4) as served:
        yield served


@pytest.fixture(scope="module")
def slow_server(database: str) -> Iterator[ExampleServer]:
    """``PSP_DELAY_MS=3000 make run``: the payment provider takes three seconds."""
    with example_server(database, psp_delay_ms=3000, workers=1, threads=4) as served:
        yield served


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_curl_names_a_port_of_its_own(page: Path) -> None:
    blocks = bash_blocks(page)
    assert len(blocks) == 2
    for block in blocks:
        assert 'BASE="http://127.0.0.1:${PORT:-8000}"' in block
        urls = re.findall(r"curl [^\n]*?(\S*/api/\S*)", block)
        assert urls and all(url.startswith('"$BASE/') for url in urls), urls
        assert "8000" not in block.replace("${PORT:-8000}", "")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_curls_answer_as_their_comments_say(page: Path, server: ExampleServer) -> None:
    assert server.port != 8000
    output = run(bash_blocks(page)[0], server.port)
    # 201, its replay, 422 key-reused, 400 missing-key
    assert statuses(output) == [201, 201, 422, 400], output
    assert headers_named(output, "Idempotent-Replayed") == ["true"], output
    for slug in ("key-reused", "missing-key"):
        assert f"/problems/{slug}" in output


#: A ``sleep`` for the 409 block: the reader's "sleep 1" stands for "until the first request
#: holds the key", which is what this one waits for (a key in progress in the example's
#: database), however long the first curl takes to be served on a busy machine.
UNTIL_CLAIMED = """#!{python}
import sqlite3, time
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    with sqlite3.connect({path!r}) as db:
        held = db.execute(
            "SELECT count(*) FROM django_idempotency_idempotencykey WHERE status = 'in_progress'"
        ).fetchone()[0]
    if held:
        break
    time.sleep(0.02)
"""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_409_block(
    page: Path, slow_server: ExampleServer, database: str, tmp_path: Path
) -> None:
    """The second curl meets the first request in progress (its provider takes 3 s)."""
    block = bash_blocks(page)[1]
    assert "\nsleep 1\n" in block
    sleep = tmp_path / "sleep"
    db_path = database.removeprefix("sqlite:///")
    sleep.write_text(UNTIL_CLAIMED.format(python=sys.executable, path=db_path))
    sleep.chmod(0o755)
    output = run(block, slow_server.port, path=str(tmp_path))
    assert statuses(output) == [409], output
    assert headers_named(output, "Retry-After") == ["1"], output
    assert "/problems/request-in-progress" in output
