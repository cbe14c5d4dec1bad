"""MkDocs hooks that keep the reference pages in step with the code.

* Every problem type in ``django_idempotency.errors`` gets a page at
  ``problems/<slug>/``, the address its ``type`` URI points at (a hand-written
  ``docs/problems/<slug>.md`` takes precedence).
* ``errors.md`` must have a section ``{#<slug>}`` for every problem type, and ``api.md``
  a row for every system check id in ``checks.py``. ``settings.md`` follows the
  declarations of ``conf.SETTINGS``: its overview is the table they make, and its groups
  and their settings are theirs, in their order. A gap is a warning, so
  ``mkdocs build --strict`` fails.
* The fault table of ``how-it-works.md`` has a row for every cell of the fault matrix
  (``CELLS`` in ``tests/system/test_faults.py``, each with its ``test_<cell>`` function), and
  no other row.
* Each problem page says what its own class's docstring says: a problem class without a
  docstring of its own (an inherited one does not count) is a warning. The headings of
  ``errors.md``'s sections read ``<the class's title>: <status>``.
* Every check id (``E001``, ``W101``, ...) a page names exists in the code.
* A code block shows code a project can paste: no import of ``example_project`` or
  ``tests``, no view class subscripted for a type checker, no ``# type: ignore``; and no
  line wider than the page's column (``CODE_COLUMNS``), which would scroll.
* The site needs no network: no page loads a script or a stylesheet from another host,
  no page holds a Mermaid block left for a script to render (diagrams are SVGs made by
  ``docs/diagrams/render.py`` from the ``.mmd`` source beside them, each carrying the
  SHA-256 of its source, so an SVG older than its source is a warning), and the 404 page
  links relative to the site's root unless the build knows where the site is served
  (``READTHEDOCS_CANONICAL_URL``).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
# First, whatever else is on the path: mkdocs may have put the checkout there for the
# loading of this module alone, and an installed copy must not be documented instead.
sys.path.insert(0, str(ROOT))
import django_idempotency  # noqa: E402 - the checkout's, now that it is first on the path

log = logging.getLogger("mkdocs.hooks.django_idempotency")
if Path(django_idempotency.__file__ or "").resolve().parent != ROOT / "django_idempotency":
    log.warning("the docs describe %s, not this checkout's package", django_idempotency.__file__)

from django.conf import settings  # noqa: E402 - after the checkout's package is first

if not settings.configured:
    # The problem classes' titles and details are lazy translations: without settings
    # they could not be read. Without translations they are the English they are written in.
    settings.configure(USE_I18N=False)


def problem_classes() -> list[type[Any]]:
    from django_idempotency import errors

    found = [
        cls
        for _name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.IdempotencyError) and cls is not errors.IdempotencyError
    ]
    return sorted(found, key=lambda cls: (cls.status, cls.slug))


def own_doc(cls: type[Any]) -> str:
    """The class's own docstring in Markdown (RST ````code```` as ```code```), "" when it
    has none: ``inspect.getdoc`` would hand a subclass its base class's docstring."""
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or not doc.strip():
        return ""
    return inspect.cleandoc(doc).replace("``", "`")


def problem_page(cls: type[Any]) -> str:
    error = cls()
    body = {
        "type": error.type_uri,
        "title": str(cls.title),
        "status": cls.status,
        "detail": str(error.detail),
    }
    doc = own_doc(cls)
    if not doc:
        log.warning(
            "the problem class %s (errors.py) has no docstring of its own: its page at "
            "problems/%s/ needs one saying what happened and what the client should do",
            cls.__name__,
            cls.slug,
        )
    lines = [
        f"# {cls.slug}",
        "",
        f"**{cls.status} {cls.title}**",
        "",
    ]
    if doc:
        lines += [doc, ""]
    lines += [
        f"Raised as `django_idempotency.errors.{cls.__name__}` and answered as an RFC 9457",
        "`application/problem+json` document:",
        "",
        "```{.json .wrap}",
        json.dumps(body, indent=2, ensure_ascii=False),
        "```",
        "",
        f"More on when it happens and what to do: [errors](../errors.md#{cls.slug}).",
        "",
    ]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    for cls in problem_classes():
        path = f"problems/{cls.slug}.md"
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, content=problem_page(cls)))
    return files


def fault_cells() -> tuple[list[str], set[str]]:
    """``CELLS`` of tests/system/test_faults.py and the names of its test functions, read
    without importing the tests."""
    tree = ast.parse((ROOT / "tests" / "system" / "test_faults.py").read_text(encoding="utf-8"))
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
        log.warning("tests/system/test_faults.py has no CELLS")
    rows = set(re.findall(r"^\| `([a-z0-9-]+)`:", how_it_works, flags=re.MULTILINE))
    for cell in cells:
        if "test_" + cell.replace("-", "_") not in tests:
            log.warning(
                "the fault cell %r has no test function in tests/system/test_faults.py", cell
            )
        if cell not in rows:
            log.warning("how-it-works.md's fault table has no row for the cell %r", cell)
    for row in sorted(rows - set(cells)):
        log.warning("how-it-works.md's fault table has a row %r that the matrix lacks", row)


def check_ids() -> set[str]:
    """The ids of the system checks the package's modules register."""
    sources = "".join(
        path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "django_idempotency").rglob("*.py"))
        if "migrations" not in path.parts
    )
    # ID + "E001", "django_idempotency.E101", and the deploy check's ids (return "E040",
    # a table keyed by "E041").
    found = re.findall(
        r'(?:ID \+ "|"django_idempotency\.|return "|Rule\("|^ +")([EW]\d{3})"', sources, re.M
    )
    return set(found)


def check_mentioned_ids(docs: Path, known: set[str]) -> None:
    """A check id named on any page (``E002``, ``django_idempotency.W101``) must exist."""
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for check_id in sorted(set(re.findall(r"\b([EW]\d{3})\b", text)) - known):
            log.warning(
                "%s names the check %s, which no module of the package has",
                page.relative_to(docs),
                check_id,
            )


def check_error_sections(errors_md: str) -> None:
    """errors.md has a section per problem type, headed by the class's title and status,
    and its table gives each the class's status."""
    for cls in problem_classes():
        anchor = f"{{#{cls.slug}}}"
        heading = re.search(rf"^## (.*?) {re.escape(anchor)}\s*$", errors_md, re.MULTILINE)
        if heading is None:
            log.warning(
                "errors.md has no section {#%s} for the problem type %s (errors.py)",
                cls.slug,
                cls.__name__,
            )
        elif heading.group(1) != f"{cls.title}: {cls.status}":
            log.warning(
                "errors.md heads the section {#%s} %r; the class %s says %r",
                cls.slug,
                heading.group(1),
                cls.__name__,
                f"{cls.title}: {cls.status}",
            )
        row = re.search(rf"^\| (\d+) \| \[`{re.escape(cls.slug)}`\]", errors_md, re.MULTILINE)
        if row is not None and int(row.group(1)) != cls.status:
            log.warning("errors.md's table gives %s the status %s", cls.slug, row.group(1))


DIAGRAM_HASH = re.compile(r"<!-- mermaid source sha256: ([0-9a-f]{64}) -->")


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def check_diagrams(docs: Path) -> None:
    """Every ``docs/diagrams/*.mmd`` has its SVG, rendered from the source as it is now."""
    for source in sorted((docs / "diagrams").glob("*.mmd")):
        svg = source.with_suffix(".svg")
        if not svg.exists():
            log.warning("%s has no SVG: run docs/diagrams/render.py", source.relative_to(docs))
            continue
        found = DIAGRAM_HASH.search(svg.read_text(encoding="utf-8"))
        if found is None or found.group(1) != source_hash(source):
            log.warning(
                "%s is older than its source %s: run docs/diagrams/render.py",
                svg.relative_to(docs),
                source.name,
            )


def on_pre_build(config: Any) -> None:
    docs = Path(config["docs_dir"])
    check_error_sections((docs / "errors.md").read_text(encoding="utf-8"))

    known = check_ids()
    api_md = (docs / "api.md").read_text(encoding="utf-8")
    for check_id in sorted(known):
        if f"`django_idempotency.{check_id}`" not in api_md:
            log.warning("api.md does not list the system check django_idempotency.%s", check_id)
    check_mentioned_ids(docs, known)

    check_fault_table((docs / "how-it-works.md").read_text(encoding="utf-8"))
    check_diagrams(docs)

    for problem in settings_page_problems((docs / "settings.md").read_text(encoding="utf-8")):
        log.warning("settings.md: %s", problem)


# -- the settings page, held to the declarations of conf.py ---------------------------------

OVERVIEW_START = "<!-- overview: made from conf.SETTINGS by docs/hooks.py; do not edit -->"
OVERVIEW_END = "<!-- end of overview -->"


def default_text(value: Any) -> str:
    """A setting's default as the overview shows it: Python, a long list shortened."""
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        items = [f'"{item}"' for item in value[:2]]
        more = ", …" if len(value) > 2 else "," if len(value) == 1 else ""
        return "`(" + ", ".join(items) + more + ")`"
    return f"`{value!r}`"


def settings_overview() -> str:
    """The overview table of settings.md, made from ``conf.SETTINGS``: each setting with its
    default, its one line, and the checks that guard it, in the page's order."""
    from django_idempotency.conf import SETTINGS

    rows = ["| Key | Default | What it sets | Checks |", "| --- | --- | --- | --- |"]
    for name, setting in SETTINGS.items():
        checks = ", ".join(f"`{check}`" for check in dict.fromkeys(setting.checks))
        link = f"[`{name}`](#{name.lower()})"
        rows.append(f"| {link} | {default_text(setting.default)} | {setting.doc} | {checks} |")
    return "\n".join([OVERVIEW_START, *rows, OVERVIEW_END])


def settings_page_problems(markdown: str) -> list[str]:
    """Where settings.md departs from ``conf.SETTINGS``: the overview is not the one the
    declarations make (:func:`settings_overview`), the groups (``##``) are not
    ``conf.GROUPS`` in their order, or a group's settings (``###``) are not the ones that
    name it, in their order; a check id a setting names that no module has."""
    from django_idempotency.conf import GROUPS, SETTINGS

    problems: list[str] = []
    start, end = markdown.find(OVERVIEW_START), markdown.find(OVERVIEW_END)
    if start < 0 or end < 0 or markdown[start : end + len(OVERVIEW_END)] != settings_overview():
        problems.append(
            "the overview is not the one conf.SETTINGS makes: replace it with "
            "docs/hooks.py's settings_overview() (python docs/hooks.py settings)"
        )
    found: dict[str, list[str]] = {}
    group = ""
    for line in markdown[end:].splitlines():
        if line.startswith("## "):
            group = line[3:].strip()
            found.setdefault(group, [])
        elif (heading := re.fullmatch(r"### `([A-Z0-9_]+)`\s*", line)) and group:
            found[group].append(heading.group(1))
    declared = {g: [n for n, s in SETTINGS.items() if s.group == g] for g in GROUPS}
    grouped = [g for g in found if found[g]]
    if grouped != list(GROUPS):
        problems.append(f"its groups are {grouped}; conf.GROUPS: {list(GROUPS)}")
    for name in GROUPS:
        if name in found and found[name] != declared[name]:
            problems.append(f"{name!r} documents {found[name]}; conf.SETTINGS: {declared[name]}")
    known = check_ids()
    for name, setting in SETTINGS.items():
        for check in sorted(set(setting.checks) - known):
            problems.append(f"{name} names the check {check}, which no module has")
    return problems


# -- code a reader can paste ---------------------------------------------------------------

#: A code block of a page, as pymdownx.highlight renders it: its classes and its HTML.
CODE_BLOCK = re.compile(
    r'<div class="([^"]*)highlight">(?:<span class="filename">.*?</span>)?<pre\b[^>]*>(.*?)</pre>',
    re.S,
)
#: What a project's own code never says: the example project's or the tests' modules, a
#: view class subscripted for a type checker, a type checker's silencing.
NOT_PASTEABLE = re.compile(
    r"^\s*(?:from|import) (?:example_project|tests)\b"
    r"|\b\w*(?:View|ViewSet)\[\w+\]"
    r"|#\s*type:\s*ignore",
    re.M,
)


def code_blocks(html: str, *, wrapped: bool = True) -> list[str]:
    """The text of each code block of ``html``, as the reader sees it (without the blocks
    marked ``.wrap`` unless ``wrapped``)."""
    import html as entities

    return [
        entities.unescape(re.sub(r"<[^>]+>", "", body))
        for classes, body in CODE_BLOCK.findall(html)
        if wrapped or "wrap" not in classes.split()
    ]


#: The widest line a code block shows without a scroll bar: the column of the theme's
#: content at a 1400 px wide window, both sidebars shown, is 656 px of code at 13.6 px,
#: 80 characters of DejaVu Sans Mono (Menlo and SF Mono: 80 too, Consolas 87), as
#: Chromium measures it on the built site.
CODE_COLUMNS = 80


def check_code(html: str, where: str) -> None:
    for text in code_blocks(html):
        for found in NOT_PASTEABLE.finditer(text):
            log.warning("%s shows code a project cannot paste: %r", where, found.group(0).strip())
    for text in code_blocks(html, wrapped=False):
        for line in text.expandtabs().splitlines():
            if len(line) > CODE_COLUMNS:
                log.warning(
                    "%s has a code line of %d columns (at most %d fit): %r",
                    where,
                    len(line),
                    CODE_COLUMNS,
                    line,
                )


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    check_code(html, page.file.src_uri)
    return html


# -- a site that needs no network ---------------------------------------------------------

#: A script or a stylesheet (or a font host preconnected for one) from another host.
EXTERNAL = re.compile(
    r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^\s\"'>]+"
    r"|<link\b(?=[^>]*\brel=[\"']?(?:stylesheet|preconnect|preload|modulepreload))"
    r"[^>]*\bhref=[\"']?(?:https?:)?//[^\s\"'>]+",
    re.IGNORECASE,
)
MERMAID_FENCE = re.compile(r"^\s*(```|~~~)\s*\{?\s*\.?mermaid\b", re.MULTILINE)


def external_references(html: str) -> list[str]:
    return [match.group(0) for match in EXTERNAL.finditer(html)]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if MERMAID_FENCE.search(markdown):
        log.warning(
            "%s has a Mermaid block, which only a script from the network would render: "
            "put its source in docs/diagrams/<name>.mmd, run docs/diagrams/render.py and "
            "show the SVG",
            page.file.src_uri,
        )
    return markdown


def on_post_page(output: str, page: Any, config: Any) -> str:
    for found in external_references(output):
        log.warning("%s loads %r from the network", page.file.src_uri, found)
    if re.search(r'class="[^"]*\bmermaid\b', output):
        log.warning("%s has an unrendered Mermaid diagram", page.file.src_uri)
    return output


def on_config(config: Any) -> Any:
    """On Read the Docs the site's address is the version's own (``/en/stable/``, ...)."""
    canonical = os.environ.get("READTHEDOCS_CANONICAL_URL")
    if canonical:
        config["site_url"] = canonical
    return config


def relative_404(html: str, base_path: str) -> str:
    """The 404 page with its links to ``base_path`` (the site's path, ``/en/latest/``)
    made relative to the site's root, where the page is."""
    if base_path in ("", "/"):
        pattern = r'(\b(?:href|src|action)=")/(?!/)'
    else:
        pattern = rf'(\b(?:href|src|action)="){re.escape(base_path.rstrip("/"))}/'
    return re.sub(pattern, r"\1", html).replace('="."', '="./"')


def on_post_template(output: str, template_name: str, config: Any) -> str:
    if template_name != "404.html":
        return output
    for found in external_references(output):
        log.warning("404.html loads %r from the network", found)
    if os.environ.get("READTHEDOCS_CANONICAL_URL"):
        return output  # served by Read the Docs at every missing address: absolute links
    from urllib.parse import urlsplit

    return relative_404(output, urlsplit(config["site_url"] or "/").path or "/")


if __name__ == "__main__" and sys.argv[1:] == ["settings"]:
    print(settings_overview())  # the overview of settings.md, to paste
