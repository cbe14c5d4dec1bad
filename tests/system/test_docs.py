"""The documentation site: each problem page says its own class's text, the site needs no
network, the diagrams match their sources, the pages name only check ids that exist, and
the settings page follows the declarations of conf.py.

The pages are made by docs/hooks.py; these tests call its functions and build the whole
site once (``mkdocs build --strict`` in a subprocess, as ``make docs`` and Read the Docs do).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from django_idempotency import errors

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytest.importorskip("material", reason="the docs extra is not installed")


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()
CLASSES: list[type[errors.IdempotencyError]] = hooks.problem_classes()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr
    return out


def text_of(html: str) -> str:
    """The visible text of a page's article, whitespace collapsed."""
    article = html.split("<article", 1)[1].split("</article>", 1)[0]
    text = re.sub(r"<[^>]+>", " ", article)
    for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&#39;", "'")):
        text = text.replace(entity, char)
    return words(text.replace("&amp;", "&"))


def words(doc: str) -> str:
    """Text without its whitespace and code marks, which the HTML's markup moves about."""
    return "".join(doc.replace("`", "").split())


def test_every_problem_class_has_a_docstring_of_its_own() -> None:
    assert len(CLASSES) >= 12
    bare = [cls.__name__ for cls in CLASSES if not hooks.own_doc(cls)]
    assert bare == []
    docs = [hooks.own_doc(cls) for cls in CLASSES]
    assert len(set(docs)) == len(docs)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.slug)
def test_each_problem_page_carries_its_own_text_and_no_other(
    cls: type[errors.IdempotencyError], site: Path
) -> None:
    """The generated Markdown and the built page say what the class's docstring says, and
    nothing another class (or the base class) says."""
    markdown = hooks.problem_page(cls)
    page = text_of((site / "problems" / cls.slug / "index.html").read_text(encoding="utf-8"))
    own = words(hooks.own_doc(cls))
    assert own in words(markdown)
    assert own in page
    assert words(f'"title": "{cls.title}"') in page
    assert words(f'"status": {cls.status}') in page
    base = words(inspect_doc(errors.IdempotencyError))
    assert base not in page
    for other in CLASSES:
        if other is not cls:
            assert words(hooks.own_doc(other)) not in page, other.__name__


def inspect_doc(cls: type[Any]) -> str:
    return str(cls.__dict__["__doc__"])


def test_a_problem_class_without_a_docstring_fails_the_build(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A subclass of a documented class inherits its docstring; the page does not."""

    class Undocumented(errors.RequestInProgress):
        slug = "undocumented"

    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        markdown = hooks.problem_page(Undocumented)
    assert words(hooks.own_doc(errors.RequestInProgress)) not in words(markdown)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "Undocumented (errors.py) has no docstring of its own" in caplog.text


def test_the_error_headings_are_the_classes_titles() -> None:
    errors_md = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    for cls in CLASSES:
        assert f"## {cls.title}: {cls.status} {{#{cls.slug}}}\n" in errors_md


def test_a_heading_that_is_not_the_title_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    errors_md = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    drifted = errors_md.replace(
        f"## {errors.LeaseLost.title}: 409 {{#lease-lost}}", "## Claim lost: 409 {#lease-lost}"
    )
    assert drifted != errors_md
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.check_error_sections(errors_md)
        assert caplog.records == []
        hooks.check_error_sections(drifted)
    assert "heads the section {#lease-lost} 'Claim lost: 409'" in caplog.text


def test_no_page_loads_anything_from_the_network(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    loading = {
        str(page.relative_to(site)): found
        for page in pages
        if (found := hooks.external_references(page.read_text(encoding="utf-8")))
    }
    assert loading == {}
    unrendered = [
        str(page.relative_to(site))
        for page in pages
        if 'class="mermaid' in page.read_text(encoding="utf-8")
        or "sequenceDiagram" in text_of_or_empty(page)
    ]
    assert unrendered == []


def text_of_or_empty(page: Path) -> str:
    html = page.read_text(encoding="utf-8")
    return text_of(html) if "<article" in html else ""


def test_the_diagrams_are_svgs_of_their_current_sources(site: Path) -> None:
    sources = sorted((ROOT / "docs" / "diagrams").glob("*.mmd"))
    assert {s.stem for s in sources} >= {"naive-race", "claim", "hybrid-request"}
    for source in sources:
        svg = (site / "diagrams" / f"{source.stem}.svg").read_text(encoding="utf-8")
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        assert svg.startswith(f"<!-- mermaid source sha256: {digest} -->\n<svg")
    how = (site / "how-it-works" / "index.html").read_text(encoding="utf-8")
    assert 'src="../diagrams/claim.svg"' in how
    assert not (site / "diagrams" / "claim.mmd").exists()


def test_a_stale_or_missing_svg_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copytree(ROOT / "docs" / "diagrams", tmp_path / "diagrams")
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.check_diagrams(tmp_path)
        assert caplog.records == []
        claim = tmp_path / "diagrams" / "claim.mmd"
        claim.write_text(claim.read_text() + "    Note over A: edited\n")
        (tmp_path / "diagrams" / "naive-race.svg").unlink()
        hooks.check_diagrams(tmp_path)
    assert "diagrams/claim.svg is older than its source claim.mmd" in caplog.text
    assert "diagrams/naive-race.mmd has no SVG" in caplog.text


def test_a_mermaid_block_or_a_script_from_a_cdn_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    page = type("Page", (), {"file": type("File", (), {"src_uri": "x.md"})()})()
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.on_page_markdown("text\n\n```mermaid\nsequenceDiagram\n```\n", page, {}, None)
        hooks.on_post_page(
            '<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>'
            '<link rel="stylesheet" href="//fonts.googleapis.com/css">',
            page,
            {},
        )
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "x.md has a Mermaid block" in messages[0]
    assert "unpkg.com" in messages[1]
    assert "fonts.googleapis.com" in messages[2]
    assert hooks.external_references('<script src="assets/x.js"></script>') == []


def test_the_404_page_links_relative_to_the_site_root(site: Path) -> None:
    html = (site / "404.html").read_text(encoding="utf-8")
    links = re.findall(r'\b(?:href|src)="([^"]+)"', html)
    assert "assets/stylesheets/" in " ".join(links)
    rooted = [link for link in links if link.startswith("/")]
    assert rooted == []
    assert hooks.relative_404('<a href="/en/latest/errors/">', "/en/latest/") == (
        '<a href="errors/">'
    )


def test_the_settings_page_follows_the_declarations_of_conf() -> None:
    """docs/settings.md's overview is the table conf.SETTINGS makes, and its groups and
    their settings are the declared ones, in their order (``python docs/hooks.py settings``
    prints the overview to paste after a change of conf.py)."""
    markdown = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert hooks.settings_page_problems(markdown) == []


def test_a_settings_page_that_departs_from_conf_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    markdown = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    stale = markdown.replace("| `E004` |", "| `E004`, `E015` |", 1)
    moved = markdown.replace("### `HEADER`", "### `HEADERS`", 1)
    regrouped = markdown.replace("## Time partitions", "## Partitions", 1)
    assert "overview" in " ".join(hooks.settings_page_problems(stale))
    assert any("HEADERS" in problem for problem in hooks.settings_page_problems(moved))
    assert any("groups" in problem for problem in hooks.settings_page_problems(regrouped))


def test_every_check_id_a_page_names_exists(caplog: pytest.LogCaptureFixture) -> None:
    known = hooks.check_ids()
    assert {"E001", "E013", "E020", "E021", "E040", "E080", "E101", "W101"} <= known
    named = set()
    for page in (ROOT / "docs").rglob("*.md"):
        named |= set(re.findall(r"\b([EW]\d{3})\b", page.read_text(encoding="utf-8")))
    assert named - known == set()
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.check_mentioned_ids(ROOT / "docs", known - {"E013"})
    assert "names the check E013, which no module of the package has" in caplog.text


def test_the_repository_is_linked_and_is_the_packages_source(site: Path) -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    repo = project["urls"]["Source"]
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert f"\nrepo_url: {repo}\n" in config
    assert f'href="{repo}"' in (site / "index.html").read_text(encoding="utf-8")


# -- code a reader can paste, in the column of the page ----------------------------------------


def test_the_examples_shown_are_code_a_project_can_paste(site: Path) -> None:
    """The strict build has failed otherwise; here what the check looks at is there: the
    included examples, with their app's own imports."""
    quickstart = "\n".join(hooks.code_blocks((site / "quickstart" / "index.html").read_text()))
    assert "class ChargeViewSet(IdempotencyMixin, viewsets.ModelViewSet):" in quickstart
    assert "from .models import Charge" in quickstart
    testing = "\n".join(hooks.code_blocks((site / "testing" / "index.html").read_text()))
    assert "class ChargeTests(APITestCase):" in testing and "from .models import" in testing


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("from example_project.payments.models import Charge", "from example_project"),
        ("import tests.support", "import tests"),
        ("class V(IdempotencyMixin, viewsets.ModelViewSet[Charge]):", "ModelViewSet[Charge]"),
        ("key = request.idempotency.key  # type: ignore[attr-defined]", "# type: ignore"),
    ],
)
def test_code_a_project_cannot_paste_is_a_warning(
    caplog: pytest.LogCaptureFixture, line: str, found: str
) -> None:
    html = '<div class="highlight"><pre><span></span><code>{}</code></pre></div>'
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.check_code(html.format("from .models import Charge"), "fine.md")
        assert caplog.records == []
        hooks.check_code(html.format(line.replace("[", "<span>[</span>")), "page.md")
    assert f"page.md shows code a project cannot paste: {found!r}" in caplog.text


@pytest.mark.parametrize(
    ("line", "wrapped"), [("x" * 81, False), ("x" * 80, False), ("x" * 200, True)]
)
def test_a_code_line_wider_than_the_column_is_a_warning(
    caplog: pytest.LogCaptureFixture, line: str, wrapped: bool
) -> None:
    """Unless its block is marked ``.wrap`` (a real answer whose lines cannot break)."""
    classes = "wrap highlight" if wrapped else "highlight"
    html = f'<div class="{classes}"><pre><span></span><code>{line}</code></pre></div>'
    with caplog.at_level(logging.WARNING, logger=hooks.log.name):
        hooks.check_code(html, "page.md")
    too_wide = len(line) > hooks.CODE_COLUMNS and not wrapped
    assert ("a code line of" in caplog.text) is too_wide


@pytest.mark.browser
def test_no_code_block_scrolls_in_a_1400_pixel_window(site: Path) -> None:
    """What CODE_COLUMNS stands for, in Chromium: on every page of the built site, at a
    window 1400 px wide, no code block is wider than its column (those marked ``.wrap``
    wrap their lines instead)."""
    import functools
    import http.server
    import threading

    from tests.support.browser import browser_page

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = sorted(path.parent.relative_to(site) for path in site.rglob("*/index.html"))
    assert len(pages) > 20
    scrolling: list[str] = []
    try:
        with browser_page(1400) as page:
            for path in pages:
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/{path}/")
                widths = page.evaluate(
                    "() => [...document.querySelectorAll('pre > code')]"
                    ".map(code => [code.scrollWidth, code.clientWidth])"
                )
                scrolling += [f"{path}: {w}" for w in widths if w[0] > w[1]]
    finally:
        server.shutdown()
        server.server_close()
    assert scrolling == []
