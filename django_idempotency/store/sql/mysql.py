"""MariaDB's and MySQL's dialects (Django's ``mysql`` backend serves both).

Times come from ``UTC_TIMESTAMP(6)``, the server's clock in UTC whatever the session's
time zone (Django stores datetimes there in UTC, as naive ``DATETIME(6)``; check E034
refuses a database whose times are kept in another zone). The claim is ``INSERT … SELECT
… FROM DUAL WHERE … ON DUPLICATE KEY UPDATE id = id``: on a duplicate of the unique
(scope, key) index it changes nothing (no ``INSERT IGNORE``, which would turn every other
error, a truncation among them, into a warning). MariaDB's ends with ``RETURNING`` the id
when the row holds this claim's token, NULL otherwise; MySQL has no ``RETURNING``, and its
claimant reads its row back and compares the token. A batch of the purge is one
``DELETE … ORDER BY expires_at LIMIT n`` (MySQL refuses a subquery on the table it
deletes from). The conditional upserts (``advisory_lock``'s completed record and the
``hybrid`` outbox insert) are not built: those strategies need PostgreSQL or SQLite.
"""

from __future__ import annotations

from .base import BaseDialect, Names
from .parts import Param, Part


class MySQLDialect(BaseDialect):
    vendor = "mysql"
    display_name = "MySQL/MariaDB"
    strategies = frozenset({"db"})
    session_from_options = True
    clock_in_sql = True
    now_sql = "UTC_TIMESTAMP(6)"
    now_plus_sql = "(UTC_TIMESTAMP(6) + INTERVAL %s SECOND)"
    from_nothing = " FROM DUAL"
    upserts = False
    read_timeout_option = "read_timeout"  # mysqlclient's; it waits for ever without it

    @classmethod
    def insert_or_nothing(cls, s: Names) -> list[Part]:
        return [f" ON DUPLICATE KEY UPDATE {s.col('id')} = {s.col('id')}"]

    @classmethod
    def delete_first(cls, s: Names, where: list[Part], order: str, limit: Param) -> list[Part]:
        return [f"DELETE FROM {s.table} WHERE ", *where, f" ORDER BY {order} LIMIT ", limit]


class MariaDBDialect(MySQLDialect):
    @classmethod
    def insert_or_nothing(cls, s: Names) -> list[Part]:
        # RETURNING gives the row after the statement, inserted or not: its id only when it
        # holds this claim's token (inserted now), else NULL.
        return [
            *super().insert_or_nothing(s),
            f" RETURNING CASE WHEN {s.col('claim_token')} = ",
            Param("claim_token"),
            f" THEN {s.col('id')} END",
        ]
