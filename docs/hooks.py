"""MkDocs hooks that keep the reference pages in step with the code.

* Every problem type in ``django_idempotency.errors`` gets a page at
  ``problems/<slug>/``, the address its ``type`` URI points at (a hand-written
  ``docs/problems/<slug>.md`` takes precedence).
* ``errors.md`` must have a section ``{#<slug>}`` for every problem type,
  ``settings.md`` a heading for every key of ``conf.DEFAULTS`` (and none for a key
  that no longer exists), and ``api.md`` a row for every system check id in
  ``checks.py``. A gap is a warning, so ``mkdocs build --strict`` fails.
* The fault table of ``how-it-works.md`` has a row for every cell of the fault matrix
  (``CELLS`` in ``tests/test_faults.py``, each with its ``test_<cell>`` function), and
  no other row.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("mkdocs.hooks.django_idempotency")


def problem_classes() -> list[type[Any]]:
    from django_idempotency import errors

    found = [
        cls
        for _name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.IdempotencyError) and cls is not errors.IdempotencyError
    ]
    return sorted(found, key=lambda cls: (cls.status, cls.slug))


def problem_page(cls: type[Any]) -> str:
    error = cls()
    body = {
        "type": error.type_uri,
        "title": cls.title,
        "status": cls.status,
        "detail": error.detail,
    }
    doc = inspect.getdoc(cls) or ""
    lines = [
        f"# {cls.slug}",
        "",
        f"**{cls.status} {cls.title}**",
        "",
        f"Raised as `django_idempotency.errors.{cls.__name__}` and answered as an RFC 9457",
        "`application/problem+json` document:",
        "",
        "```json",
        json.dumps(body, indent=2),
        "```",
        "",
    ]
    if doc:
        lines += [doc, ""]
    lines += [
        f"When it happens and what a client should do: [errors](../errors.md#{cls.slug}).",
        "",
    ]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    for cls in problem_classes():
        path = f"problems/{cls.slug}.md"
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, content=problem_page(cls)))
    return files


def _headings(markdown: str) -> set[str]:
    return set(re.findall(r"^#{2,4} `([A-Z0-9_]+)`\s*$", markdown, flags=re.MULTILINE))


def fault_cells() -> tuple[list[str], set[str]]:
    """``CELLS`` of tests/test_faults.py and the names of its test functions, read
    without importing the tests."""
    tree = ast.parse((ROOT / "tests" / "test_faults.py").read_text(encoding="utf-8"))
    cells: list[str] = []
    tests: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            tests.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "CELLS" for t in targets):
            cells = list(ast.literal_eval(node.value))  # type: ignore[union-attr]
    return cells, tests


def check_fault_table(how_it_works: str) -> None:
    cells, tests = fault_cells()
    if not cells:
        log.warning("tests/test_faults.py has no CELLS")
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`:", how_it_works, flags=re.MULTILINE))
    for cell in cells:
        if "test_" + cell.replace("-", "_") not in tests:
            log.warning("the fault cell %r has no test function in tests/test_faults.py", cell)
        if cell not in rows:
            log.warning("how-it-works.md's fault table has no row for the cell %r", cell)
    for row in sorted(rows - set(cells)):
        log.warning("how-it-works.md's fault table has a row %r that the matrix lacks", row)


def on_pre_build(config: Any) -> None:
    docs = Path(config["docs_dir"])
    errors_md = (docs / "errors.md").read_text(encoding="utf-8")
    for cls in problem_classes():
        if f"{{#{cls.slug}}}" not in errors_md:
            log.warning(
                "errors.md has no section {#%s} for the problem type %s (errors.py)",
                cls.slug,
                cls.__name__,
            )

    check_sources = "".join(
        (ROOT / "django_idempotency" / name).read_text(encoding="utf-8")
        for name in ("checks.py", "middleware.py", "redis_checks.py")
    )
    api_md = (docs / "api.md").read_text(encoding="utf-8")
    ids = re.findall(r'(?:ID \+ "|"django_idempotency\.)([EW]\d{3})"', check_sources)
    for check_id in sorted(set(ids)):
        if f"`django_idempotency.{check_id}`" not in api_md:
            log.warning("api.md does not list the system check django_idempotency.%s", check_id)

    check_fault_table((docs / "how-it-works.md").read_text(encoding="utf-8"))

    from django_idempotency.conf import DEFAULTS

    documented = _headings((docs / "settings.md").read_text(encoding="utf-8"))
    for name in sorted(set(DEFAULTS) - documented):
        log.warning("settings.md does not document IDEMPOTENCY[%r] (conf.DEFAULTS)", name)
    for name in sorted(documented - set(DEFAULTS)):
        log.warning("settings.md documents IDEMPOTENCY[%r], which conf.DEFAULTS lacks", name)
