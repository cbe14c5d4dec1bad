"""The pieces a statement is composed of: text, named parameters and the current time.

A builder (one per statement, in the family modules of this package) returns a list of
parts; :class:`~django_idempotency.store.sql.statement.Statement` turns it into the SQL
of one vendor and the order of its parameters.
"""

from __future__ import annotations

from collections.abc import Sequence


class Param:
    """A named parameter of a statement."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Now:
    """The current time in a statement (see :attr:`BaseDialect.clock_in_sql
    <django_idempotency.store.sql.base.BaseDialect.clock_in_sql>`), plus the number of
    seconds in parameter ``offset`` when given (negative for the past)."""

    __slots__ = ("offset",)

    def __init__(self, offset: str | None = None) -> None:
        self.offset = offset


Part = str | Param | Now


def joined(parts: Sequence[Part | list[Part]], separator: str = ", ") -> list[Part]:
    """``parts`` with ``separator`` between them; an item that is a list of parts (an
    expression with a time or a parameter inside) is one item."""
    result: list[Part] = []
    for index, part in enumerate(parts):
        if index:
            result.append(separator)
        if isinstance(part, list):
            result += part
        else:
            result.append(part)
    return result


def lapsed(locked: str, at: Part) -> list[Part]:
    """The lease rule: the lease in column ``locked`` was last renewed at or before ``at``,
    or never (the purge's ORM filter, ``IdempotencyKeyQuerySet.purgeable``, keeps exactly
    the leases this calls live)."""
    return [f"({locked} IS NULL OR {locked} <= ", at, ")"]
