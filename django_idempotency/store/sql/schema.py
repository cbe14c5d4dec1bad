"""The names the statements use on one connection, and the conditions several share.

:class:`Schema` quotes the tables and columns of IdempotencyKey and of its outbox as the
connection quotes them, and composes the conditions that more than one statement needs:
a stale lease, a row free for a takeover, the key's live outbox row. Each builder takes
a Schema and returns its statement's parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

from ..status import COMPLETED, IN_PROGRESS
from .parts import Now, Param, Part, lapsed
from .statement import Statement

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .base import BaseDialect


class Schema:
    """IdempotencyKey's and IdempotencyOutbox's names on one connection, for one dialect."""

    def __init__(
        self,
        connection: BaseDatabaseWrapper,
        dialect: type[BaseDialect],
        keys: type[models.Model],
        outbox: type[models.Model],
    ) -> None:
        self.q = q = connection.ops.quote_name
        self.dialect = dialect
        self.table = q(keys._meta.db_table)
        self.outbox = q(outbox._meta.db_table)
        self.fields: dict[str, models.Field[Any, Any]] = {
            field.name: field for field in keys._meta.concrete_fields
        }
        self.outbox_fields: dict[str, models.Field[Any, Any]] = {
            field.name: field for field in outbox._meta.concrete_fields
        }

    def col(self, name: str) -> str:
        """IdempotencyKey's column of field ``name``, quoted."""
        return self.q(str(self.fields[name].column))

    def outbox_col(self, name: str) -> str:
        """The outbox's column of field ``name``, quoted and qualified by its table."""
        return f"{self.outbox}.{self.q(str(self.outbox_fields[name].column))}"

    def statement(self, *parts: Part) -> Statement:
        """The statement of ``parts`` in this dialect."""
        return Statement(self.dialect, self.fields["expires_at"], *parts)

    # -- conditions shared by several statements ------------------------------------------

    def stale(self) -> list[Part]:
        """In progress under a lease older than ``lock_timeout`` (``stale`` = -lock_timeout)."""
        return [
            f"{self.col('status')} = '{IN_PROGRESS}' AND ",
            *lapsed(self.col("locked_at"), Now("stale")),
        ]

    def free(self, *stale_also: Part) -> list[Part]:
        """A stale lease (and ``stale_also``), or a completed key whose TTL is over: free
        for a takeover."""
        return [
            f"(({self.col('status')} = '{COMPLETED}' AND {self.col('expires_at')} <= ",
            Now(),
            ") OR (",
            *self.stale(),
            *stale_also,
            "))",
        ]

    def claimable(self) -> list[Part]:
        """:meth:`free` for the claim of a request of fingerprint ``fingerprint``: a stale
        claim that committed steps (docs/steps.md) is free only for a request with its
        content; one with other content is answered as the row says, without touching it."""
        steps, fingerprint = self.col("steps"), self.col("fingerprint")
        return self.free(f" AND ({steps} IS NULL OR {fingerprint} = ", Param("fingerprint"), ")")

    def outbox_live(self, now: Part) -> list[Part]:
        """``FROM`` the key's live outbox row: a response the ``hybrid`` strategy committed
        that is not drained yet. It settles the key whatever strategy is in use now."""
        return [
            f" FROM {self.outbox} WHERE {self.outbox_col('scope')} = ",
            Param("scope"),
            f" AND {self.outbox_col('key')} = ",
            Param("key"),
            f" AND {self.outbox_col('expires_at')} > ",
            now,
        ]

    def takeover_where(self) -> list[Part]:
        """`` WHERE`` the row ``pk``, still under ``old_token``, is free (stale or expired, on
        the database's clock) and the outbox holds no live completion of its key: the row a
        takeover may replace."""
        col, table, outbox = self.col, self.table, self.outbox_col
        return [
            f" WHERE {col('id')} = ",
            Param("pk"),
            f" AND {col('claim_token')} = ",
            Param("old_token"),
            " AND ",
            *self.free(),
            f" AND NOT EXISTS (SELECT 1 FROM {self.outbox} WHERE {outbox('scope')} = ",
            f"{table}.{col('scope')} AND {outbox('key')} = {table}.{col('key')} ",
            f"AND {outbox('expires_at')} > ",
            Now(),
            ")",
        ]

    def key_where(self) -> list[Part]:
        """`` WHERE`` IdempotencyKey's row of parameters ``scope`` and ``key``."""
        return [
            f" WHERE {self.col('scope')} = ",
            Param("scope"),
            f" AND {self.col('key')} = ",
            Param("key"),
        ]
