"""The compiled SQL behind the managers: one builder per statement, one dialect per vendor.

The statements are private to the store: those of IdempotencyKey and of its outbox are
composed by the builders of the family modules (:mod:`.claim`, :mod:`.read`, :mod:`.owner`,
:mod:`.completed`, :mod:`.fence`, :mod:`.outbox`, :mod:`.purge`) from the models' columns,
in the SQL of the connection's dialect (:mod:`.postgresql`, :mod:`.sqlite`, :mod:`.mysql`),
and cached per connection by :func:`statements`. The layers above ask a dialect's features
(:func:`features_of`), never a vendor's name. What the statements do is told in
docs/how-it-works.md and docs/hybrid.md.
"""

from __future__ import annotations

from .claim import CLAIM_COLUMNS
from .completed import STORE_COLUMNS
from .outbox import OUTBOX_ADD_COLUMNS
from .postgresql import ASYNC_COMMIT, and_commit, commits_in_statement
from .statement import NOT_STORED_MARKER, Statement, not_stored
from .statements import (
    Statements,
    clock_in_sql,
    database,
    dialect_for,
    features_of,
    running,
    statements,
)

__all__ = [
    "ASYNC_COMMIT",
    "CLAIM_COLUMNS",
    "NOT_STORED_MARKER",
    "OUTBOX_ADD_COLUMNS",
    "STORE_COLUMNS",
    "Statement",
    "Statements",
    "and_commit",
    "clock_in_sql",
    "commits_in_statement",
    "database",
    "dialect_for",
    "features_of",
    "not_stored",
    "running",
    "statements",
]
