"""The completed record written in one statement, for a caller that serialises the key itself.

``advisory_lock`` holds a transaction-level advisory lock on the key for the whole request,
so it needs no claim row: it writes the completed record at the end, over an expired one
only, never over one another execution completed.
"""

from __future__ import annotations

from ..status import COMPLETED
from .parts import Now, Param, Part, joined
from .schema import Schema

#: The columns of the completed record (the first two are the conflict target).
STORE_COLUMNS = (
    "scope",
    "key",
    "fingerprint",
    "status",
    "claim_token",
    "locked_at",
    "request_method",
    "request_path",
    "response_status",
    "response_headers",
    "response_body",
    "created_at",
    "completed_at",
    "expires_at",
)


def store(s: Schema) -> list[Part]:
    """``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE expired RETURNING id``."""
    stored: dict[str, Part] = {
        "created_at": Now(),
        "completed_at": Now(),
        "expires_at": Now("ttl"),
        "status": f"'{COMPLETED}'",
        "locked_at": "NULL",
    }
    updates = ", ".join(f"{s.col(name)} = EXCLUDED.{s.col(name)}" for name in STORE_COLUMNS[2:])
    return [
        f"INSERT INTO {s.table} ({', '.join(s.col(name) for name in STORE_COLUMNS)}) VALUES (",
        *joined([stored.get(name, Param(name)) for name in STORE_COLUMNS]),
        f") ON CONFLICT ({s.col('scope')}, {s.col('key')}) DO UPDATE SET {updates} "
        # Only over an expired record: never over one another execution completed.
        f"WHERE {s.table}.{s.col('expires_at')} <= EXCLUDED.{s.col('created_at')} "
        f"RETURNING {s.col('id')}",
    ]
