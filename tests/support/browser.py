"""Debian's headless Chromium driven by Playwright, for the browser tests (the admin, the
browsable API). Playwright's own browser download is not used.

``browser_page(width)`` yields a page in a fresh context ``width`` pixels wide. Playwright's
sync API keeps an event loop running in the calling thread, so the caller must allow
Django's ORM there (``DJANGO_ALLOW_ASYNC_UNSAFE``); the thread's database connections are
closed afterwards, or the test database could not be dropped at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import services

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def browser_page(width: int, height: int = 900) -> Iterator[Any]:
    """A Playwright page in headless Chromium, in a window ``width`` by ``height``."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    executable = services.chromium()
    assert executable is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # While Playwright's loop runs, Django keeps this thread's connections in
            # context-local storage, apart from the test's usual ones: close them here.
            connections.close_all()
