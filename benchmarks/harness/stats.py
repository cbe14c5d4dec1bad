"""The statistics every measure reports: a median with the min-max spread of the rounds.

A ratio is taken within each round (the candidate's figure and the baseline's of the same
round), then summarised over the rounds: the median is the figure, the min-max spread says
how much a single round could be trusted. Drift of a shared machine hits both sides of a
round alike, which is why the ratio is paired rather than a ratio of two medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """The median of some values, and their least and greatest."""

    median: float
    low: float
    high: float

    def format(self, spec: str = ".2f") -> str:
        """``"0.66 (0.56-0.80)"`` for ``spec=".2f"``."""
        return f"{self.median:{spec}} ({self.low:{spec}}-{self.high:{spec}})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}


def spread(values: Sequence[float]) -> Spread:
    """The median, least and greatest of ``values`` (at least one)."""
    if not values:
        raise ValueError("no values")
    return Spread(statistics.median(values), min(values), max(values))


def ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """The per-round ratios ``numerators[i] / denominators[i]``, summarised.

    For a rate (higher is better) pass the candidate's over the baseline's; for a cost
    (lower is better) the baseline's over the candidate's, so that above 1 is always the
    candidate doing better."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} rounds against {len(denominators)}")
    return spread([n / d for n, d in zip(numerators, denominators, strict=True)])
