"""What a claim found, as a value: :class:`InProgress` (409), :class:`Replay` (the stored
response), :class:`Mismatch` (422). The outcomes that act (``Claim``, ``Delegate``) are
the strategy's, in ``strategies.base``."""

from __future__ import annotations

from dataclasses import dataclass

from .response import StoredResponse


class Outcome:
    """What a claim found."""

    @property
    def label(self) -> str:
        """The outcome's name in metrics and logs: ``claimed``, ``taken_over``,
        ``in_progress``, ``replay``, ``mismatch``; ``error`` for one the engine does not
        handle. Subclasses override it with a class attribute (unannotated: not a field),
        or with a property where it depends on the claim."""
        return "error"


@dataclass(frozen=True)
class InProgress(Outcome):
    retry_after: int = 1
    label = "in_progress"


@dataclass(frozen=True)
class Replay(Outcome):
    response: StoredResponse
    label = "replay"


@dataclass(frozen=True)
class Mismatch(Outcome):
    label = "mismatch"
