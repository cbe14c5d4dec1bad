"""django-idempotency: Idempotency-Key handling that runs a side effect once."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .strategies.redis.health import Health

#: The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0.dev0"


def health() -> Health:
    """This process's Redis fallback state, for a health endpoint (no connection is made);
    see docs/observability.md."""
    from .strategies.redis.health import health as _health

    return _health()
