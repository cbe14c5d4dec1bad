"""A client that hangs up half-way through its body, against real servers.

gunicorn hands Django a body shorter than its ``Content-Length`` without an error (its
reader stops at the end of the stream): a form view would charge on half a form, a JSON
view answer its parse error, and either answer would hold the key for the whole ``TTL``, so
that the client's complete retry got ``422 key-reused``. Such a body is refused before the
claim (``400 incomplete-body``), and the complete retry runs the view, once. Under uvicorn
the server reports the hang-up to Django as a disconnect, and Django never calls the view:
the key stays free there too.

The client is a raw socket that announces the whole body, sends part of it, and then
half-closes (and reads the answer) or closes its connection.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import pytest

from ..support.asgi import uvicorn_server
from ..support.databases import count_rows
from ..support.example import ExampleServer, example_server, request, scratch_database

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.django_db(transaction=False)]

CHARGE = {"amount": 1999, "currency": "EUR"}
#: A long field after the charge's own, so that half the body still holds a whole charge.
NOTE = "n" * 24_000


def _form() -> tuple[str, bytes]:
    return "application/x-www-form-urlencoded", urlencode({**CHARGE, "note": NOTE}).encode()


def _json() -> tuple[str, bytes]:
    return "application/json", json.dumps({**CHARGE, "note": NOTE}).encode()


def send_truncated(
    server: ExampleServer, path: str, key: str, content_type: str, body: bytes, *, close: bool
) -> bytes:
    """POST ``body``'s ``Content-Length`` but only its first half, then half-close the
    connection and read the answer until the server closes it (or, with ``close``, close it
    and read nothing): what the server answered, raw."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Token alice-token\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + body[: len(body) // 2])
        if close:
            return b""
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _status_and_problem(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


def _complete_retry_runs_once(
    server: ExampleServer, db: str, path: str, key: str, charges: int
) -> None:
    """The complete request with the same key runs the view (a fresh 201), once: one charge
    more than the ``charges`` before the half body; a retry of it is a replay."""
    status, body = request(server.url + path, key=key, body=CHARGE)
    assert status == 201 and "idempotent-replayed" not in body["_headers"], (status, body)
    status, again = request(server.url + path, key=key, body=CHARGE)
    assert status == 201 and again["_headers"]["idempotent-replayed"] == "true", (status, again)
    assert again["id"] == body["id"]
    assert count_rows(db, "payments_charge") == charges + 1
    assert "Traceback" not in server.log()


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with scratch_database("postgres") as db:
        yield db


@pytest.fixture(scope="module")
def gunicorn(database: str) -> Iterator[ExampleServer]:
    with example_server(database, workers=1, threads=4) as server:
        yield server


@pytest.fixture(scope="module")
def uvicorn(database: str) -> Iterator[ExampleServer]:
    with uvicorn_server(database, workers=1) as server:
        yield server


@pytest.mark.parametrize("body", [_form, _json], ids=["form", "json"])
def test_gunicorn_refuses_half_a_body_before_the_claim(
    gunicorn: ExampleServer, database: str, body: Callable[[], tuple[str, bytes]]
) -> None:
    key = f"trunc-{uuid.uuid4().hex[:8]}"
    charges = count_rows(database, "payments_charge")
    content_type, payload = body()
    answer = send_truncated(gunicorn, "/api/charges/", key, content_type, payload, close=False)
    status, problem = _status_and_problem(answer)
    assert status == 400, answer[:400]
    assert str(problem["type"]).endswith("/incomplete-body"), problem
    assert count_rows(database, "payments_charge") == charges
    _complete_retry_runs_once(gunicorn, database, "/api/charges/", key, charges)


def test_gunicorn_leaves_the_key_free_after_a_client_that_closed(
    gunicorn: ExampleServer, database: str
) -> None:
    """The client closes instead of half-closing: nothing reads the answer, and whenever
    the server handles the half body, the complete retry still runs, once."""
    key = f"trunc-{uuid.uuid4().hex[:8]}"
    charges = count_rows(database, "payments_charge")
    content_type, payload = _form()
    send_truncated(gunicorn, "/api/charges/", key, content_type, payload, close=True)
    _complete_retry_runs_once(gunicorn, database, "/api/charges/", key, charges)


@pytest.mark.parametrize(
    "path", ["/api/charges/", "/api/async/charges/"], ids=["drf-sync", "async-decorator"]
)
def test_uvicorn_leaves_the_key_free(uvicorn: ExampleServer, database: str, path: str) -> None:
    """uvicorn tells Django the client went away (``http.disconnect``): Django answers
    nothing and calls no view, or, had the server handed the short body over, the body is
    refused as under gunicorn. Either way the complete retry runs, once."""
    key = f"trunc-{uuid.uuid4().hex[:8]}"
    charges = count_rows(database, "payments_charge")
    content_type, payload = _json()
    answer = send_truncated(uvicorn, path, key, content_type, payload, close=False)
    if answer:
        status, problem = _status_and_problem(answer)
        assert status == 400 and str(problem["type"]).endswith("/incomplete-body"), answer
    _complete_retry_runs_once(uvicorn, database, path, key, charges)
