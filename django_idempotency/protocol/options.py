"""A view's own options, declared once and read by every adapter.

``@idempotent``, ``@idempotency_opt_in`` and ``@idempotent_api_view`` take them as keyword
arguments (typed by :class:`ViewOptions`); ``IdempotencyMixin`` reads them from the class
attributes ``idempotency_<name>`` (or ``as_view()`` keywords of those names). ``None``, or an
option left out, falls back to the setting of the same name in ``settings.IDEMPOTENCY``:
``Options.resolve()`` is the one place that says so. Adding an option: a field here (in the
three classes; ``tests/protocol/test_options.py`` holds them together), its check in
``checks.settings.view_option_errors``, its use in the engine, and docs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypedDict

from ..conf import conf


class ViewOptions(TypedDict, total=False):
    """The keyword arguments of the decorators (``**options: Unpack[ViewOptions]``)."""

    methods: Iterable[str] | None
    required: bool | None
    ttl: float | None
    lock_timeout: float | None
    strategy: str | None
    wait: float | None
    steps: bool | None
    completer: bool | None


@dataclass(frozen=True)
class Options:
    """One view's options; a ``None`` field falls back to ``settings.IDEMPOTENCY``."""

    #: Methods that honour the header (kept upper-cased); ``METHODS``.
    methods: frozenset[str] | None = None
    #: Whether a request without the header is a 400; ``REQUIRED``.
    required: bool | None = None
    #: Seconds a completed key is replayed; ``TTL``.
    ttl: float | None = None
    #: Seconds after which a lease that was not renewed is stale; ``LOCK_TIMEOUT``.
    lock_timeout: float | None = None
    #: The strategy's name (or dotted path); ``STRATEGY``.
    strategy: str | None = None
    #: Seconds a duplicate waits for the first request's answer; ``WAIT``.
    wait: float | None = None
    #: The view runs in steps with recovery points (``request.idempotency.steps``,
    #: docs/steps.md); no setting: False unless a view says so.
    steps: bool | None = None
    #: A view with steps whose requests the completer finishes when their client does not
    #: come back (docs/steps.md, "The completer"); no setting: False unless a view says so.
    completer: bool | None = None

    def __post_init__(self) -> None:
        methods: Any = self.methods
        if methods is None:
            return  # the setting's (and no ABC check for it on every request)
        if isinstance(methods, Iterable) and not isinstance(methods, str | bytes):
            # Frozen: normalised the way a dataclass's own __init__ sets a field.
            object.__setattr__(self, "methods", frozenset(str(m).upper() for m in methods))

    @classmethod
    def declared(cls, where: str, **options: Any) -> Options:
        """The options a view declares as keywords; ``TypeError`` (naming ``where``) for a
        keyword that is no option, so that a misspelt option is never silently ignored."""
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(
                f"{where}: unknown idempotency option(s) {', '.join(unknown)}; "
                f"the options are {', '.join(OPTION_NAMES)}."
            )
        return cls(**options)

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (what ``checks.settings.view_option_errors`` takes)."""
        return {name: getattr(self, name) for name in OPTION_NAMES}

    def resolve(self) -> Resolved:
        """The view's values, each option left ``None`` taken from the setting of its name.
        Kept on the instance until the settings change (a view's ``Options`` is built once,
        so a request pays one attribute lookup)."""
        cached: tuple[object, Resolved] | None = self.__dict__.get("_resolved")
        generation = conf.generation
        if cached is not None and cached[0] is generation:
            return cached[1]
        resolved = Resolved(
            self.methods if self.methods is not None else conf.METHODS,
            self.required if self.required is not None else conf.REQUIRED,
            self.ttl if self.ttl is not None else conf.TTL,
            self.lock_timeout if self.lock_timeout is not None else conf.LOCK_TIMEOUT,
            self.strategy or conf.STRATEGY,
            max(self.wait if self.wait is not None else conf.WAIT, 0.0),
        )
        self.__dict__["_resolved"] = (generation, resolved)  # frozen: not a field
        return resolved

    def applies_to(self, method: str | None) -> bool:
        return (method or "").upper() in self.resolve().methods


class Resolved(NamedTuple):
    """One view's options with the settings' values in place of ``None`` (``Options.resolve``)."""

    methods: frozenset[str]
    required: bool
    ttl: float
    lock_timeout: float
    strategy: str
    wait: float


#: The option names, in declaration order.
OPTION_NAMES: tuple[str, ...] = tuple(field.name for field in fields(Options))
