"""Every compiled statement's text and parameters, per vendor, against a committed snapshot.

Each statement of ``store.sql`` is rendered for each vendor into
``tests/snapshots/sql/<vendor>/<statement>.sql`` (its parameters in a comment, the SQL
broken before its clauses): a change to one statement is a diff of one file. The
statements are built on a database wrapper that never connects, so every vendor is
rendered wherever the tests run. ``postgresql-partitioned`` holds those of PostgreSQL's
statements that differ on a key table partitioned by expiry (``PARTITION_INTERVAL``), the
key's advisory lock before the statement where it takes one. After a deliberate change,
write the snapshots again and review the diff::

    UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest -q -n 0 tests/store/sql/test_statements.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler

from django_idempotency.store.sql.base import BaseDialect
from django_idempotency.store.sql.mysql import MariaDBDialect, MySQLDialect
from django_idempotency.store.sql.statement import Statement
from django_idempotency.store.sql.statements import Statements

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "sql"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS", "").lower() not in {"", "0", "false", "no"}

#: The vendors rendered: the backend each is rendered with, and its dialect (None: the one
#: the statements pick for the backend; Django's ``mysql`` backend serves two).
VENDORS: dict[str, tuple[str, type[BaseDialect] | None]] = {
    "postgresql": ("django.db.backends.postgresql", None),
    "sqlite": ("django.db.backends.sqlite3", None),
    "mariadb": ("django.db.backends.mysql", MariaDBDialect),
    "mysql": ("django.db.backends.mysql", MySQLDialect),
}
#: Where a line of a snapshot breaks: before these words (a space in the statement). The
#: statements have no line breaks of their own, so the break is undone by joining the
#: lines with spaces.
BREAK_BEFORE = re.compile(
    r" (?=(?:FROM|WHERE|UNION ALL|ON CONFLICT|ON DUPLICATE KEY|RETURNING|ORDER BY|SET|VALUES"
    r"|AND|COMMIT) )"
)


def wrapper(vendor: str) -> BaseDatabaseWrapper:
    """A database wrapper of ``vendor`` that is never connected: the statements are
    composed without a query."""
    engine, _dialect = VENDORS[vendor]
    handler = ConnectionHandler({"default": {"ENGINE": engine, "NAME": "snapshot"}})
    return handler.create_connection("default")


#: PostgreSQL's statements on a key table partitioned by expiry (PARTITION_INTERVAL), those
#: that differ from the plain table's.
PARTITIONED = "postgresql-partitioned"


def named_statements(vendor: str) -> dict[str, Statement]:
    """Every statement built for ``vendor``, by name (the purge's four forms included)."""
    if vendor == PARTITIONED:
        plain = named_statements("postgresql")
        built = Statements(wrapper("postgresql"), partitioned=True).named()
        return {
            name: st for name, st in built.items() if name not in plain or st.sql != plain[name].sql
        }
    return Statements(wrapper(vendor), VENDORS[vendor][1]).named()


def text_of(statement: Statement) -> str:
    """The statement's text; a statement after the key's advisory lock, with the lock."""
    return str(getattr(statement, "locked_sql", statement.sql))


def _parameter(name: str, is_time: bool) -> str:
    if not is_time:
        return name
    return f"app_now+{name}" if name else "app_now"


def render(name: str, vendor: str, statement: Statement) -> str:
    """The snapshot of one statement: a comment naming it and its parameters, then its SQL."""
    assert "\n" not in statement.sql, "a statement's text is one line"
    slots = [_parameter(*slot) for slot in statement.param_slots]
    if hasattr(statement, "locked_sql"):
        slots.insert(0, "lock")
    parameters = ", ".join(slots) or "none"
    return (
        f"-- {name} ({vendor})\n-- parameters: {parameters}\n"
        + BREAK_BEFORE.sub("\n", text_of(statement))
        + "\n"
    )


CASES = [
    pytest.param(vendor, name, id=f"{vendor}-{name}")
    for vendor in [*VENDORS, PARTITIONED]
    for name in named_statements(vendor)
]


@pytest.mark.parametrize(("vendor", "name"), CASES)
def test_statement_matches_its_snapshot(vendor: str, name: str) -> None:
    statement = named_statements(vendor)[name]
    text = render(name, vendor, statement)
    path = SNAPSHOTS / vendor / f"{name}.sql"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no snapshot for {vendor}/{name}: run with UPDATE_SNAPSHOTS=1"
    committed = path.read_text(encoding="utf-8")
    assert text == committed, (
        f"{vendor}/{name} differs from {path} (UPDATE_SNAPSHOTS=1 rewrites it)"
    )
    # The snapshot is the statement itself, line breaks aside.
    sql_lines = [line for line in committed.splitlines() if not line.startswith("-- ")]
    assert " ".join(sql_lines) == text_of(statement)


@pytest.mark.parametrize("vendor", [*VENDORS, PARTITIONED])
def test_every_snapshot_is_of_a_statement(vendor: str) -> None:
    """A snapshot whose statement is gone (or renamed) fails too."""
    built = set(named_statements(vendor))
    files = {path.stem for path in (SNAPSHOTS / vendor).glob("*.sql")}
    if UPDATE:
        for stale in files - built:
            (SNAPSHOTS / vendor / f"{stale}.sql").unlink()
        files &= built
    assert sorted(files - built) == []


def test_rendering_breaks_only_at_spaces() -> None:
    """The line breaks replace spaces, so that joining the lines gives the statement back."""
    sample: Any = type("S", (), {"sql": "SELECT 1 FROM t WHERE a AND b", "param_slots": ()})
    assert (
        render("x", "v", sample)
        == "-- x (v)\n-- parameters: none\nSELECT 1\nFROM t\nWHERE a\nAND b\n"
    )
