"""Render the Mermaid sources of this folder (``*.mmd``) into the SVGs the pages show.

The site shows SVGs rather than Mermaid blocks, so that it renders without the network
(no script from a CDN) and under a strict Content-Security-Policy. Each SVG starts with
the SHA-256 of the source it was made from; ``docs/hooks.py`` fails the build when an
SVG is missing or older than its source. Run after editing a ``.mmd`` file::

    npm pack mermaid && tar xzf mermaid-*.tgz      # package/dist/mermaid.min.js
    python docs/diagrams/render.py --mermaid package/dist/mermaid.min.js

It drives a headless Chromium through Playwright (``playwright`` is in the ``test``
extra); ``--chromium`` names the browser (default ``/usr/bin/chromium``, Debian's, which
``make browser`` installs). Only sources whose SVG is stale are rendered, unless
``--all``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HASH_LINE = "<!-- mermaid source sha256: {digest} -->"
#: Mermaid's settings for every diagram: the default theme, SVG text (no HTML labels, which
#: an ``<img>`` would not lay out the same), and a fixed id so that reruns give one result.
CONFIG = {
    "startOnLoad": False,
    "theme": "default",
    "securityLevel": "strict",
    "htmlLabels": False,
    "sequence": {"useMaxWidth": False},
    "flowchart": {"htmlLabels": False, "useMaxWidth": False},
}
RENDER = """async ([source, config]) => {
    mermaid.initialize(config);
    const { svg } = await mermaid.render("diagram", source);
    return svg;
}"""


def digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def is_stale(source: Path) -> bool:
    svg = source.with_suffix(".svg")
    return not svg.exists() or HASH_LINE.format(digest=digest(source)) not in svg.read_text(
        encoding="utf-8"
    )


def render(sources: list[Path], mermaid_js: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page()
            page.set_content("<!doctype html><html><body></body></html>")
            page.add_script_tag(path=str(mermaid_js))
            for source in sources:
                svg = page.evaluate(RENDER, [source.read_text(encoding="utf-8"), CONFIG])
                svg = re.sub(r"^<svg\b", '<svg xmlns:xlink="http://www.w3.org/1999/xlink"', svg)
                if svg.count("xmlns:xlink=") > 1:
                    svg = svg.replace(' xmlns:xlink="http://www.w3.org/1999/xlink"', "", 1)
                text = HASH_LINE.format(digest=digest(source)) + "\n" + svg + "\n"
                source.with_suffix(".svg").write_text(text, encoding="utf-8")
                print(f"rendered {source.name} -> {source.with_suffix('.svg').name}")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mermaid", type=Path, required=True, help="path to mermaid.min.js")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--all", action="store_true", help="render every source, stale or not")
    args = parser.parse_args(argv)
    sources = sorted(HERE.glob("*.mmd"))
    todo = sources if args.all else [s for s in sources if is_stale(s)]
    if todo:
        render(todo, args.mermaid, args.chromium)
    else:
        print("every SVG is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
