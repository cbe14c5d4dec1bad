"""The refusal of a claimed view's writes to databases other than the keys'.

The view's transaction, which also stores the key's response, is opened on one alias
(the request's key database: ``IDEMPOTENCY["DATABASE"]``, or the shard that
``DATABASE_ROUTING`` chose, ``protocol/shards.py``). A write the view sends to another alias (a
``DATABASE_ROUTERS`` router, ``.using()``, a raw cursor) commits on its own: a view that
fails after it leaves it behind while the key is released, so the retry repeats it, and
with ``ATOMIC_REQUESTS`` on that alias the key's response commits before the write, which
may then fail to commit. So while a claimed view runs, the lifecycle puts a
:class:`WriteGuard` on this thread's connections of every other alias (not on those of
``UNPROTECTED_DATABASES``): reads and transaction control pass, any other statement is
refused before it executes, and the lifecycle answers ``503 database-misconfigured`` with
the key given back and nothing stored, even when the view caught the refusal.

Only a project with several databases pays for it: with one alias no guard is made. The
guard sees what goes through Django's cursors on the lifecycle's thread, where the view runs
(an async view's ORM calls too: ``sync_to_async`` runs them on that thread); a write made
on another thread, through the driver's own connection or ``callproc()``, is not seen.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from django.db import connections

from ..conf import conf
from ..errors import DatabaseMisconfigured

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ..values.attempt import Attempt

logger = logging.getLogger("django_idempotency")

#: What cannot hide a keyword: comments, string literals, quoted identifiers, dollar quotes.
_OPAQUE = re.compile(
    r"""--[^\n]*
      | /\*.*?\*/
      | '(?:[^']|'')*'
      | "(?:[^"]|"")*"
      | `[^`]*`
      | \$(\w*)\$.*?\$\1\$""",
    re.DOTALL | re.VERBOSE,
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
#: Row locks of a SELECT, which name UPDATE without writing.
_ROW_LOCK = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b", re.IGNORECASE)

#: Statements that read, or control the transaction or the session, by their first word;
#: any other statement is a write. A reading statement that names one of ``_WRITING`` (a
#: writing CTE, ``SELECT … INTO``, ``EXPLAIN ANALYZE DELETE``) is a write too.
_READING = frozenset(
    {"SELECT", "VALUES", "TABLE", "WITH", "SHOW", "EXPLAIN", "DECLARE", "FETCH", "MOVE"}
    | {"CLOSE", "SET", "RESET", "PRAGMA"}
)
_TRANSACTION = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"})
_WRITING = frozenset(
    {"INSERT", "UPDATE", "DELETE", "MERGE", "UPSERT", "REPLACE", "COPY", "INTO"}
    | {"CREATE", "ALTER", "DROP", "TRUNCATE", "CALL", "DO", "GRANT", "REVOKE"}
)
#: The table a write names, for the log.
_TARGET = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|MERGE\s+INTO|COPY|TRUNCATE(?:\s+TABLE)?)"
    r"\s+[\"`]?([\w.]+)",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=2048)
def writes(sql: str) -> bool:
    """Whether ``sql`` may change data: anything but reads (``SELECT`` without a writing
    CTE or ``INTO``, ``SHOW``, ``EXPLAIN`` of a read, a cursor's ``FETCH``), transaction
    control (``BEGIN``, ``SAVEPOINT``, ``RELEASE``, ``ROLLBACK [TO]``, ``COMMIT``) and
    session settings (``SET``, ``RESET``, a ``PRAGMA`` that sets nothing). Every
    statement of a multi-statement string counts; an empty or unknown one is a write."""
    text = _ROW_LOCK.sub(" ", _OPAQUE.sub(" ? ", sql))
    statements = [part.strip().lstrip("(").strip() for part in text.split(";")]
    statements = [part for part in statements if part]
    if not statements:
        return True
    return any(_statement_writes(statement) for statement in statements)


def _statement_writes(statement: str) -> bool:
    words = [word.upper() for word in _WORD.findall(statement)]
    if not words:
        return True
    first = words[0]
    if first in _TRANSACTION:
        return False
    if first not in _READING:
        return True
    if first == "PRAGMA" and "=" in statement:
        return True
    return any(word in _WRITING for word in words[1:])


def _target(sql: str) -> str:
    """The model (and table) a write names, or the table alone, or ``?``."""
    match = _TARGET.search(sql)
    if match is None:
        return "?"
    table = match.group(1).split(".")[-1]
    from django.apps import apps

    for model in apps.get_models(include_auto_created=True):
        if model._meta.db_table == table:
            return f"{model._meta.label} (table {table})"
    return f"table {table}"


Execute = Callable[[Any, Any, bool, dict[str, Any]], Any]


class WriteGuard:
    """One claimed request's guard on this thread's connections of ``aliases``
    (a Django execute wrapper); :meth:`close` takes it off them."""

    def __init__(self, attempt: Attempt, aliases: list[str]) -> None:
        self.attempt = attempt
        #: The first refusal, kept so that a view that caught it is not stored as a success.
        self.refused: DatabaseMisconfigured | None = None
        self._connections: list[BaseDatabaseWrapper] = [connections[a] for a in aliases]
        for connection in self._connections:
            connection.execute_wrappers.append(self)

    def __call__(
        self, execute: Execute, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        text = sql.decode("utf-8", "replace") if isinstance(sql, bytes) else sql
        if isinstance(text, str) and not writes(text):
            return execute(sql, params, many, context)
        self._refuse(context["connection"].alias, text if isinstance(text, str) else repr(sql))

    def _refuse(self, alias: str, statement: str) -> NoReturn:
        error = DatabaseMisconfigured()
        if self.refused is None:
            self.refused = error
            attempt = self.attempt
            logger.error(
                "idempotency key %s (scope %s): the view tried to write to the database %r, "
                "but its key is kept on %r; refused before it ran, the key is released and "
                "nothing is stored. Write: %s. Statement: %.300s. Route the model to %r, or "
                "list %r in IDEMPOTENCY['UNPROTECTED_DATABASES'] if its writes are meant to "
                "be outside the protection (see manage.py check, django_idempotency.E030).",
                attempt.key,
                attempt.scope,
                alias,
                attempt.database,
                _target(statement),
                statement,
                attempt.database,
                alias,
                extra={
                    "idempotency_scope": attempt.scope,
                    "idempotency_key": attempt.key,
                    "idempotency_outcome": "database_misconfigured",
                    "idempotency_database": alias,
                },
            )
        raise error

    def check(self) -> None:
        """Raise ``DatabaseMisconfigured`` when a write was refused: before a response is
        stored or the key released, whatever the view made of the refusal."""
        if self.refused is not None:
            raise DatabaseMisconfigured() from self.refused

    def close(self) -> None:
        connections_, self._connections = self._connections, []
        for connection in connections_:
            with contextlib.suppress(ValueError):  # the view's own code took it off
                connection.execute_wrappers.remove(self)


def guard(attempt: Attempt) -> WriteGuard | None:
    """A guard on this thread's connections of every alias but the lifecycle's
    (``attempt.database``) and ``UNPROTECTED_DATABASES``; None when there are none, as
    in a project with one database."""
    databases = connections.settings
    if len(databases) < 2:
        return None
    unprotected = conf.UNPROTECTED_DATABASES
    aliases = [a for a in databases if a != attempt.database and a not in unprotected]
    return WriteGuard(attempt, aliases) if aliases else None
