"""The settings recipes of the docs, run by the tests exactly as the docs show them.

``recipe(page, heading, index, replacements)`` takes the ``index``-th ```` ```python ````
block of the section ``heading`` of ``docs/<page>``, replaces the example addresses and
paths by the test's own (each must occur, so that a change of the docs cannot silently
leave the test running something else), and executes it: the returned namespace holds
the ``CACHES`` and ``IDEMPOTENCY`` the block defines.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def section(page: str, heading: str) -> str:
    """The text of the section ``## heading`` (up to the next ``## ``)."""
    markdown = (DOCS / page).read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    if match is None:
        raise AssertionError(f"docs/{page} has no section {heading!r}")
    return match.group(1)


def python_blocks(page: str, heading: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", section(page, heading), re.M | re.S)


def recipe(
    page: str, heading: str, index: int, replacements: dict[str, str] | None = None
) -> dict[str, Any]:
    code = python_blocks(page, heading)[index]
    for old, new in (replacements or {}).items():
        assert old in code, f"{old!r} is no longer in the recipe of docs/{page} {heading!r}"
        code = code.replace(old, new)
    namespace: dict[str, Any] = {}
    exec(compile(code, f"docs/{page}#{heading}[{index}]", "exec"), namespace)
    return namespace
