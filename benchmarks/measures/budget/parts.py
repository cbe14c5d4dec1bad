"""The parts of a request the budget files instructions and CPU under, by module.

A Python frame belongs to the part of its module (the longest prefix in ``MODULES``). The
library's modules name their part wherever they are called from; a module of Django, DRF,
psycopg or redis-py either names one part whoever calls it (the request's own machinery:
``APP``), or takes one part when the library (or the hand-written route) calls it and the
caller's part otherwise (``FROM_LIBRARY``); every other module (the standard library, the
renderers, ``django.http``...) stays in its caller's part. So the SQL that Django's ORM builds
for the library counts as the library's statement building, the psycopg calls the library
makes as its driver calls, and the view's own INSERT as the application's.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import CodeType
from typing import Any

#: Part numbers index the C evaluator's functions (``budget_part_<n>``); 0 and 1 are the
#: application's, the others the library's (or the hand-written route's).
PARTS: tuple[str, ...] = (
    "Django, DRF, the view (request, auth, serializer)",
    "the view's database calls (ORM, psycopg)",
    "key and headers",
    "scope",
    "fingerprint",
    "options",
    "lifecycle and state bookkeeping",
    "SQL / script building, store",
    "driver calls (psycopg, redis-py)",
    "response capture and storage",
    "signals and metrics",
    "problem rendering",
    "other library code",
    "the same work by hand",
    "outbox drain queued (hybrid, once a second)",
)
APP_PARTS = (0, 1)
LIBRARY_PARTS = tuple(n for n in range(len(PARTS)) if n not in APP_PARTS)
REST, VIEW_DB, KEY, SCOPE, FINGERPRINT, OPTIONS, LIFECYCLE, STORE, DRIVER, CAPTURE = range(10)
SIGNALS, PROBLEMS, OTHER, HAND, DRAIN = range(10, 15)
INHERIT = -1

LIBRARY = "django_idempotency"
#: module prefix -> part (the library's modules, the hand-written route's).
MODULES: dict[str, int] = {
    LIBRARY: OTHER,
    f"{LIBRARY}.protocol.header": KEY,
    f"{LIBRARY}.protocol.keysource": KEY,
    f"{LIBRARY}.protocol.keys": KEY,
    f"{LIBRARY}.values.keys": KEY,
    f"{LIBRARY}.values.attempt": LIFECYCLE,
    f"{LIBRARY}.values.outcomes": LIFECYCLE,
    f"{LIBRARY}.values.response": CAPTURE,
    f"{LIBRARY}.protocol.negotiation": KEY,
    f"{LIBRARY}.protocol.scope": SCOPE,
    f"{LIBRARY}.protocol.shards": SCOPE,
    f"{LIBRARY}.protocol.fingerprint": FINGERPRINT,
    f"{LIBRARY}.protocol.body": FINGERPRINT,
    f"{LIBRARY}.protocol.options": OPTIONS,
    f"{LIBRARY}.conf": OPTIONS,
    f"{LIBRARY}.checks": OPTIONS,
    f"{LIBRARY}.protocol.engine": LIFECYCLE,
    f"{LIBRARY}.protocol.lifecycle": LIFECYCLE,
    f"{LIBRARY}.protocol.transactions": LIFECYCLE,
    f"{LIBRARY}.protocol.lease": LIFECYCLE,
    f"{LIBRARY}.strategies.waiting": LIFECYCLE,
    f"{LIBRARY}.protocol.writeguard": LIFECYCLE,
    f"{LIBRARY}.mixins": LIFECYCLE,
    f"{LIBRARY}.decorators": LIFECYCLE,
    f"{LIBRARY}.middleware": LIFECYCLE,
    f"{LIBRARY}.drf": LIFECYCLE,
    f"{LIBRARY}.strategies": LIFECYCLE,
    f"{LIBRARY}.store": STORE,
    f"{LIBRARY}.strategies.redis.store": STORE,
    f"{LIBRARY}.strategies.redis.outcome": STORE,
    f"{LIBRARY}.protocol.replay": CAPTURE,
    f"{LIBRARY}.store.records": CAPTURE,
    f"{LIBRARY}.signals": SIGNALS,
    f"{LIBRARY}.metrics": SIGNALS,
    f"{LIBRARY}.errors": PROBLEMS,
    f"{LIBRARY}.protocol.problems": PROBLEMS,
    f"{LIBRARY}.browsable": PROBLEMS,
    f"{LIBRARY}.tasks": DRAIN,
    "celery": DRAIN,
    "kombu": DRAIN,
    "benchmarks.control.orders.hand": HAND,
}
#: module prefix -> part whoever calls it: the request's own machinery.
APP: dict[str, int] = {
    "django.core.handlers": REST,
    "django.test": REST,
    "django.middleware": REST,
    "django.contrib": REST,
    "django.urls": REST,
    "rest_framework.views": REST,
    "rest_framework.generics": REST,
    "rest_framework.mixins": REST,
    "rest_framework.serializers": REST,
    "rest_framework.fields": REST,
    "rest_framework.authentication": REST,
    "rest_framework.permissions": REST,
    "benchmarks.control.orders.views": REST,
    "benchmarks.control.orders.models": REST,
}
#: module prefix -> (part when the library calls it, when anything else does).
FROM_LIBRARY: dict[str, tuple[int, int]] = {
    "django.db": (DRIVER, VIEW_DB),
    "django.db.models": (STORE, VIEW_DB),
    "psycopg": (DRIVER, VIEW_DB),
    "psycopg_c": (DRIVER, VIEW_DB),
    "psycopg_binary": (DRIVER, VIEW_DB),
    "redis": (DRIVER, INHERIT),
    "django.dispatch": (SIGNALS, INHERIT),
}


def _location(module: str) -> str | None:
    """The file of a module, or the directory (with a trailing separator) of a package."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    if spec.submodule_search_locations:
        return os.path.dirname(os.path.realpath(spec.origin)) + os.sep
    return os.path.realpath(spec.origin)


class Classifier:
    """``classify(code) -> (part when called from a library part, part otherwise)``."""

    def __init__(self) -> None:
        table: list[tuple[str, tuple[int, int]]] = []
        for prefixes, pair in (
            (MODULES, lambda part: (part, part)),
            (APP, lambda part: (part, part)),
            (FROM_LIBRARY, lambda parts: parts),
        ):
            for module, value in prefixes.items():
                where = _location(module)
                if where is not None:
                    table.append((where, pair(value)))
        # Longest first: a module wins over its package.
        self.table = sorted(table, key=lambda item: len(item[0]), reverse=True)
        self.cache: dict[str, tuple[int, int]] = {}

    def __call__(self, code: CodeType) -> tuple[int, int]:
        path = code.co_filename
        found = self.cache.get(path)
        if found is None:
            real = os.path.realpath(path)
            found = next(
                (pair for where, pair in self.table if real == where or real.startswith(where)),
                (INHERIT, INHERIT),
            )
            self.cache[path] = found
        return found


def install() -> Any:
    """The compiled evaluator, installed; its ``run(callable, timed)`` then files each frame."""
    from .native import load

    parts = load()
    parts.install(Classifier(), LIBRARY_PARTS)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    return parts
