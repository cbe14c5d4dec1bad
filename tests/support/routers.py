"""Database routers for the tests of keys and views' data on different databases
(tests/protocol/test_writeguard.py). Each sends the models of some apps to one alias and
leaves every other model where Django puts it (``default``)."""

from __future__ import annotations

from typing import Any


class _AppsOn:
    """Reads and writes of the models of ``apps`` on ``alias``; no say on the others."""

    apps: frozenset[str] = frozenset()
    alias = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label in self.apps else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label in self.apps else None


class KeysApart(_AppsOn):
    """The library's models on ``keys``, the views' models on ``default``: with
    ``IDEMPOTENCY["DATABASE"] = "keys"`` the views write outside the keys' transaction."""

    apps = frozenset({"django_idempotency"})
    alias = "keys"


class TestAppOnSqlite(_AppsOn):
    """The test views' ``SideEffect`` on ``sqlite`` while the keys stay on ``default``."""

    apps = frozenset({"testapp"})
    alias = "sqlite"


class EverythingOnKeys:
    """The fixed configuration: every model on ``keys``, where the keys are."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "keys"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "keys"
