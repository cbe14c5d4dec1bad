"""Interleaved rounds: every case runs once per round, in an order that changes each round.

A measure that compares cases on a shared machine runs them in turn rather than one after
the other, so that a slow minute hits every case, and changes their order from round to
round, so that no case always runs just after another (a warm cache, a server that has
just been busy). Three orders are offered, each measure keeping the one it always had:

* ``rotate``: round ``r`` starts at case ``r`` (cases ``a b c``, then ``b c a``...);
* ``flip``: the listed order in even rounds, reversed in odd ones;
* ``shuffle``: a new random order each round, from a fixed seed (the same runs each time).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

T = TypeVar("T")
Order = Literal["rotate", "flip", "shuffle"]
SEED = 20261130


def orders(names: Sequence[str], rounds: int, how: Order = "rotate") -> list[list[str]]:
    """The order of ``names`` in each of ``rounds`` rounds."""
    names = list(names)
    shuffle = random.Random(SEED).shuffle
    result = []
    for r in range(rounds):
        if how == "rotate":
            shift = r % len(names) if names else 0
            order = names[shift:] + names[:shift]
        elif how == "flip":
            order = names if r % 2 == 0 else names[::-1]
        else:
            order = names[:]
            shuffle(order)
        result.append(order)
    return result


def interleave(
    names: Sequence[str],
    rounds: int,
    run: Callable[[str, int], T],
    how: Order = "rotate",
    progress: Callable[[int, dict[str, T]], None] | None = None,
) -> dict[str, list[T]]:
    """``run(name, round)`` for every name in every round; the results by name, round by
    round. ``progress(round, that round's results, in the order of names)`` follows each
    round."""
    results: dict[str, list[T]] = {name: [] for name in names}
    for r, order in enumerate(orders(names, rounds, how)):
        this_round = {}
        for name in order:
            this_round[name] = run(name, r)
            results[name].append(this_round[name])
        if progress is not None:
            progress(r, {name: this_round[name] for name in names})
    return results
