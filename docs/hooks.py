"""MkDocs hooks that keep the reference pages in step with the code.

* Every problem type in ``django_idempotency.errors`` gets a page at
  ``problems/<slug>/``, the address its ``type`` URI points at (a hand-written
  ``docs/problems/<slug>.md`` takes precedence).
* ``errors.md`` must have a section ``{#<slug>}`` for every problem type,
  ``settings.md`` a heading for every key of ``conf.DEFAULTS`` (and none for a key
  that no longer exists), and ``api.md`` a row for every system check id in
  ``checks.py``. A gap is a warning, so ``mkdocs build --strict`` fails.
"""

from __future__ import annotations

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

    checks_py = (ROOT / "django_idempotency" / "checks.py").read_text(encoding="utf-8")
    api_md = (docs / "api.md").read_text(encoding="utf-8")
    for check_id in sorted(set(re.findall(r'ID \+ "([EW]\d{3})"', checks_py))):
        if f"`django_idempotency.{check_id}`" not in api_md:
            log.warning("api.md does not list the system check django_idempotency.%s", check_id)

    from django_idempotency.conf import DEFAULTS

    documented = _headings((docs / "settings.md").read_text(encoding="utf-8"))
    for name in sorted(set(DEFAULTS) - documented):
        log.warning("settings.md does not document IDEMPOTENCY[%r] (conf.DEFAULTS)", name)
    for name in sorted(documented - set(DEFAULTS)):
        log.warning("settings.md documents IDEMPOTENCY[%r], which conf.DEFAULTS lacks", name)
