"""What a measure prints: the conditions of the run, and its results as tables.

A ``Table`` has named columns, each with a format for its floats; a cell is text, a number
(an int printed as it is) or a ``Spread`` (printed as ``median (min-max)``). ``emit`` prints
the tables and, with ``--json FILE``, writes them there too, the numbers unformatted.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .stats import Spread

Cell = str | int | float | Spread | None


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def conditions(what: str = "") -> str:
    """One line on the machine and its load now, and what the run is."""
    line = (
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load_average()}"
    )
    return f"{line}; {what}" if what else line


@dataclass(frozen=True)
class Column:
    heading: str
    spec: str = ""  # the format of a float (or of a Spread's three) in this column


@dataclass
class Table:
    title: str
    columns: Sequence[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def render(self) -> str:
        text = [[col.heading for col in self.columns]]
        text += [
            [_text(cell, col.spec) for cell, col in zip(row, self.columns, strict=True)]
            for row in self.rows
        ]
        widths = [max(len(row[i]) for row in text) for i in range(len(self.columns))]
        lines = [self.title] if self.title else []
        for row in text:
            cells = zip(row, widths, self.columns, strict=True)
            lines.append(
                "  ".join(_align(cell, w, i, col) for i, (cell, w, col) in enumerate(cells))
            )
        if self.note:
            lines.append(self.note)
        return "\n".join(line.rstrip() for line in lines)

    def as_dict(self) -> dict[str, Any]:
        headings = [col.heading for col in self.columns]
        return {
            "title": self.title,
            "rows": [
                {h: _raw(cell) for h, cell in zip(headings, row, strict=True)} for row in self.rows
            ],
        }


def _text(cell: Cell, spec: str) -> str:
    if cell is None:
        return ""
    if isinstance(cell, Spread):
        return cell.format(spec or ".2f")
    if isinstance(cell, float) and spec:
        return f"{cell:{spec}}"
    return str(cell)


def _align(text: str, width: int, index: int, column: Column) -> str:
    """The first column (the case's name) and text columns to the left, figures (the
    columns with a format) to the right."""
    return text.ljust(width) if index == 0 or not column.spec else text.rjust(width)


def _raw(cell: Cell) -> Any:
    return cell.as_dict() if isinstance(cell, Spread) else cell


def emit(tables: Sequence[Table], json_path: Path | None = None, **extra: Any) -> None:
    """Print ``tables`` and the load average now; write them (and ``extra``) to
    ``json_path`` when given."""
    for table in tables:
        print(f"\n{table.render()}")
    print(f"\nload average after: {load_average()}", flush=True)
    if json_path is not None:
        document = {"python": sys.version.split()[0], "tables": [t.as_dict() for t in tables]}
        json_path.write_text(json.dumps({**document, **extra}, indent=2) + "\n")
