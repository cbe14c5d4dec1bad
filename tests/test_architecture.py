"""docs/architecture.md's module map names every module of the package, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_idempotency"


def mapped_modules() -> set[str]:
    """The paths the map's ``text`` block lists, relative to the package."""
    markdown = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = markdown.split("## Where things live", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    found: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder) of the enclosing folders
    for line in block.splitlines()[1:]:  # the first line is the package itself
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(folder for _indent, folder in folders)
        if name.endswith("/"):
            folders.append((indent, name))
        elif re.fullmatch(r"[\w/]+\.py", name):
            found.add(prefix + name)
    return found


def package_modules() -> set[str]:
    """Every module of the package but the migrations and the bare package markers."""
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and not (path.name == "__init__.py" and path.stat().st_size == 0)
    }


def test_every_module_has_its_line_in_the_map() -> None:
    assert sorted(package_modules() - mapped_modules()) == []


def test_the_map_names_no_module_that_does_not_exist() -> None:
    assert sorted(mapped_modules() - package_modules()) == []


def test_one_module_per_line() -> None:
    markdown = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = markdown.split("## Where things live", 1)[1].split("```text\n", 1)[1]
    block = block.split("```", 1)[0]
    crowded = [line for line in block.splitlines() if len(re.findall(r"\.py\b", line)) > 1]
    assert crowded == []
