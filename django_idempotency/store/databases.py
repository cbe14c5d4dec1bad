"""The databases that hold keys, as the operations on every key see them (the purge, the
drain, their commands and tasks); which one holds a request's key is ``protocol.shards``'."""

from __future__ import annotations

from ..conf import conf


def key_databases(using: str | None = None) -> list[str]:
    """The databases an operation on every key runs on (the purge, the drain): ``using``
    alone when given, else every one of ``KEY_DATABASES``."""
    return [using] if using else list(conf.KEY_DATABASES)
