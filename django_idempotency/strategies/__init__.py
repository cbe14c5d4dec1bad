"""Claim strategies; the one named by ``IDEMPOTENCY["STRATEGY"]`` is loaded once per name."""

from __future__ import annotations

import threading

from django.utils.module_loading import import_string

from ..conf import conf
from ..errors import ImproperlyConfiguredStrategy
from .base import Strategy

BUILTIN = {
    "db": "django_idempotency.strategies.db.DatabaseStrategy",
    "advisory_lock": "django_idempotency.strategies.advisory.AdvisoryLockStrategy",
    "redis": "django_idempotency.strategies.redis.strategy.RedisStrategy",
    "hybrid": "django_idempotency.strategies.hybrid.HybridStrategy",
}

_loaded: dict[str, Strategy] = {}
_lock = threading.Lock()


def load_strategy(name: str) -> Strategy:
    """Instantiate the strategy ``name`` (a built-in name or a dotted path), once."""
    strategy = _loaded.get(name)
    if strategy is not None:
        return strategy
    with _lock:
        strategy = _loaded.get(name)
        if strategy is None:
            path = BUILTIN.get(name, name)
            try:
                cls = import_string(path)
            except ImportError as exc:
                # The message is check E006's: the same at start-up, in `manage.py check`
                # and for a view's strategy= at its first request.
                raise ImproperlyConfiguredStrategy(
                    f"cannot load idempotency strategy {name!r}: {exc}"
                ) from exc
            if not (isinstance(cls, type) and issubclass(cls, Strategy)):
                raise ImproperlyConfiguredStrategy(f"{path} is not a Strategy subclass.")
            strategy = _loaded[name] = cls()
    return strategy


def get_strategy(name: str | None = None) -> Strategy:
    return load_strategy(name or conf.STRATEGY)


def reset() -> None:
    """Forget loaded strategies and the cached settings (tests, or after changing the
    settings without ``setting_changed``, e.g. by assigning ``settings.IDEMPOTENCY``)."""
    conf.reload()
    with _lock:
        _loaded.clear()
