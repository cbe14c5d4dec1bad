"""The admin in a real browser: Debian's headless Chromium driven by Playwright.

Logs in, lists and filters keys, opens one, and releases a stuck key through the
confirmation page. Screenshots of the list, a key and the confirmation go to
``docs/img/admin*.png`` with ``UPDATE_SCREENSHOTS=1`` (to a temporary directory otherwise).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from tests.factories import CompletedKeyFactory, ExpiredKeyFactory, StaleKeyFactory
from tests.support import services

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
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


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the ORM calls
    # this test makes between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    executable = services.chromium()
    assert executable is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": 1680, "height": 900})
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # While Playwright's loop runs, Django keeps this thread's connections in
            # context-local storage, apart from the test's usual ones: close them here,
            # or the test database cannot be dropped at the end of the run.
            connections.close_all()


def screenshot(page: Any, tmp_path: Path, name: str) -> None:
    """Into the test's directory; into docs/img/ as well with UPDATE_SCREENSHOTS=1."""
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=False)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / name).write_bytes(target.read_bytes())


def charge_body(n: int) -> bytes:
    return json.dumps(
        {"id": n, "amount": 1250 * n, "currency": "EUR", "psp_reference": f"psp_{n:08x}"}
    ).encode()


def seed() -> tuple[IdempotencyKey, IdempotencyKey]:
    now = timezone.now()
    for n in range(1, 6):
        CompletedKeyFactory(
            scope=f"user:{40 + n}",
            key=f"order-{1000 + n}-charge",
            created_at=now - timedelta(minutes=7 * n),
            response_body=charge_body(n),
        )
    CompletedKeyFactory(
        scope="user:46",
        key="order-1006-charge",
        response_status=422,
        response_headers={"Content-Type": "application/json"},
        response_body=b'{"amount": ["Ensure this value is greater than or equal to 1."]}',
        created_at=now - timedelta(minutes=3),
    )
    ExpiredKeyFactory(scope="user:7", key="order-0917-charge")
    stuck = StaleKeyFactory(scope="user:42", key="order-1007-charge")
    shown = IdempotencyKey.objects.get(key="order-1001-charge")
    return stuck, shown


def test_admin_list_filter_detail_and_release(
    page: Any, live_server: Any, admin_user: Any, tmp_path: Path
) -> None:
    stuck, shown = seed()
    base = live_server.url

    # Log in.
    page.goto(f"{base}/admin/login/?next=/admin/django_idempotency/idempotencykey/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 8

    screenshot(page, tmp_path, "admin.png")

    # Filters: status, then expired, then the response class.
    page.click("#changelist-filter a:text-is('in progress')")
    page.wait_for_url("**status__exact=in_progress**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "order-1007-charge" in rows.first.inner_text()

    page.goto(f"{base}/admin/django_idempotency/idempotencykey/")
    page.click("#changelist-filter details:has(summary:text-is(' By expired ')) a:text-is('Yes')")
    page.wait_for_url("**expired=yes**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "order-0917-charge" in page.locator("#result_list").inner_text()

    page.goto(f"{base}/admin/django_idempotency/idempotencykey/?response_class=4xx")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "order-1006-charge" in page.locator("#result_list").inner_text()

    # Search, and open one key: headers and the indented JSON body.
    page.goto(f"{base}/admin/django_idempotency/idempotencykey/")
    page.fill("#searchbar", "order-1001")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=order-1001**")
    page.click("#result_list a:text-is('order-1001-charge')")
    page.wait_for_url(f"**/{shown.pk}/change/**")
    body = page.locator("pre.idempotency-body").inner_text()
    assert json.loads(body) == json.loads(charge_body(1))
    assert '\n  "amount": 1250,' in body
    assert "application/json" in page.locator("table.idempotency-headers").inner_text()
    assert page.locator("input[name=_save]").count() == 0  # read-only
    screenshot(page, tmp_path, "admin-detail.png")

    # Release the stuck key through its confirmation page.
    page.goto(f"{base}/admin/django_idempotency/idempotencykey/?status__exact=in_progress")
    page.check(f"input[name=_selected_action][value='{stuck.pk}']")
    page.select_option("select[name=action]", "release_stuck_keys")
    page.click("button[name=index]")
    page.wait_for_selector("#release-keys")
    confirmation = page.locator("#content").inner_text()
    assert "order-1007-charge" in confirmation
    assert "stale" in confirmation
    assert IdempotencyKey.objects.filter(pk=stuck.pk).exists()  # not before confirming
    screenshot(page, tmp_path, "admin-release.png")
    page.click("input[type=submit][value='Yes, release them']")
    page.wait_for_selector("ul.messagelist")
    assert "Released 1 in-progress key." in page.locator("ul.messagelist").inner_text()
    assert not IdempotencyKey.objects.filter(pk=stuck.pk).exists()
    assert IdempotencyKey.objects.count() == 7
