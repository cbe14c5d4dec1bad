"""The budget's tables: one for new keys, one for replays; a column per route (the plain
view first), a row per part, then the total and the ratio plain ÷ route."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.harness.report import Column, Table
from benchmarks.harness.stats import ratio, spread

from .parts import PARTS

NO_PART = "no part (outside the parts' functions)"


def kinds(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """("new key", [plain, db, ...]) and ("replay", [plain, db-replay, ...])."""
    new = [n for n in names if not n.endswith("-replay")]
    replay = ["plain", *(n for n in names if n.endswith("-replay"))]
    return [("new key", new), ("replay", replay)]


def heading(name: str) -> str:
    return name.removesuffix("-replay")


def instruction_tables(names: Sequence[str], counts: dict[str, dict[int, int]]) -> list[Table]:
    tables = []
    for kind, columns in kinds(names):
        table = Table(
            f"Instructions per request, {kind} (callgrind, thousands; ratio = plain ÷ route)",
            [Column("part"), *(Column(heading(c), ".0f") for c in columns)],
        )
        rows = [(label, n) for n, label in enumerate(PARTS)] + [(NO_PART, -1)]
        for label, number in rows:
            cells = [counts.get(c, {}).get(number, 0) / 1e3 for c in columns]
            if any(abs(cell) >= 0.5 for cell in cells):
                table.add(label, *cells)
        totals = [sum(counts.get(c, {}).values()) / 1e3 for c in columns]
        table.add("total", *totals)
        table.add("ratio plain ÷ route", *(f"{totals[0] / t:.2f}" if t else "" for t in totals))
        tables.append(table)
    return tables


def time_tables(names: Sequence[str], samples: dict[str, list[Any]]) -> list[Table]:
    """``samples[route]``: per round, [bare µs per request, [µs per part]]."""
    tables = []
    plain = [bare for bare, _split in samples["plain"]]
    for kind, columns in kinds(names):
        table = Table(
            f"Client CPU per request, {kind} (µs, median of the rounds; the parts with the "
            "part clock on, the total and the ratio without it: median (min-max))",
            [Column("part"), *(Column(heading(c), ".0f") for c in columns)],
        )
        table.add("changes of part per request", *(
            statistics.median(split[-1] for _bare, split in samples[c]) for c in columns
        ))  # fmt: skip
        for number, label in enumerate(PARTS):
            cells = [
                statistics.median(split[number] for _bare, split in samples[c]) for c in columns
            ]
            if any(cell >= 0.5 for cell in cells):
                table.add(label, *cells)
        table.add("total, part clock on", *(
            statistics.median(sum(split[:-1]) for _bare, split in samples[c]) for c in columns
        ))  # fmt: skip
        table.add("total, bare", *(spread([bare for bare, _ in samples[c]]) for c in columns))
        table.add("ratio plain ÷ route", *(
            ratio(plain, [bare for bare, _ in samples[c]]).format(".2f") for c in columns
        ))  # fmt: skip
        tables.append(table)
    return tables
