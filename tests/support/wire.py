"""What a Django connection sends PostgreSQL, message by message (libpq's protocol trace)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

_QUERY = re.compile(r'^F\t\d+\tQuery\t "(.*)"$', re.S)


@contextmanager
def queries_sent(alias: str = "default") -> Iterator[list[str]]:
    """The simple-protocol queries that connection ``alias`` sends inside the block, in
    order, with psycopg's own ``BEGIN`` and ``COMMIT``: one per round trip (Django's
    psycopg 3 backend binds parameters client-side and sends every statement so). The
    list is filled in when the block ends."""
    from psycopg import pq

    connection = connections[alias]
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            # A query's text may hold newlines: a message starts at a line with a direction.
            messages = re.split(r"\n(?=[FB]\t)", trace.read())
    for message in messages:
        match = _QUERY.match(message.strip("\n"))
        if match:
            sent.append(match.group(1))
