"""The admin in a real browser: Debian's headless Chromium driven by Playwright.

Logs in, lists and filters keys, opens one, and releases a stuck key through the
confirmation page, in a window 1400 pixels wide: no page scrolls sideways, the
breadcrumb names the app once, ages are in words, the confirmation speaks of one key or
of several. Screenshots of the list, a key and the confirmation go to
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
from django.utils import timezone

from django_idempotency.models import IdempotencyKey
from tests.support.browser import browser_page
from tests.support.factories import CompletedKeyFactory, ExpiredKeyFactory, StaleKeyFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
#: The width of the browser window: a laptop's, where the list used to scroll sideways.
WIDTH = 1400


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # The ORM calls this test makes between browser steps are plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with browser_page(WIDTH) as page:
        yield page


def screenshot(page: Any, tmp_path: Path, name: str) -> None:
    """Into the test's directory; into docs/img/ as well with UPDATE_SCREENSHOTS=1."""
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=False)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / name).write_bytes(target.read_bytes())


#: Every element of the page that scrolls sideways (its content is wider than its box),
#: and the page itself when it is wider than the window.
OVERFLOW_JS = """() => {
    const found = [];
    const root = document.documentElement;
    if (root.scrollWidth > window.innerWidth) found.push(`page: ${root.scrollWidth}px`);
    for (const el of document.body.querySelectorAll("*")) {
        const overflow = getComputedStyle(el).overflowX;
        if ((overflow === "auto" || overflow === "scroll") && el.scrollWidth > el.clientWidth) {
            found.push(`${el.tagName}.${el.className}: ${el.scrollWidth}px in ${el.clientWidth}px`);
        }
    }
    return found;
}"""


def assert_fits(page: Any) -> None:
    """Nothing on the page scrolls sideways at the window's width."""
    assert page.evaluate("window.innerWidth") == WIDTH
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    assert page.evaluate(OVERFLOW_JS) == []


def trail(*crumbs: str) -> str:
    """A breadcrumb as the admin shows it: the crumbs joined by a single right-pointing
    angle quotation mark."""
    return " \u203a ".join(crumbs)


def words(text: str) -> str:
    """``text`` with every run of whitespace (non-breaking spaces too) as one space."""
    return " ".join(text.split())


def cell(page: Any, key: str, column: str) -> str:
    row = page.locator("#result_list tbody tr", has_text=key)
    return words(row.locator(f".field-{column}").inner_text())


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
    # What some clients send: a long scope (a tenant's), a key of 64 hex digits.
    CompletedKeyFactory(
        scope="tenant:acme-payments-europe:user:1234567",
        key="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        created_at=now - timedelta(minutes=1),
    )
    stuck = StaleKeyFactory(scope="user:42", key="order-1007-charge")
    shown = IdempotencyKey.objects.get(key="order-1001-charge")
    return stuck, shown


CHANGELIST = "/admin/django_idempotency/idempotencykey/"


def log_in(page: Any, base: str) -> None:
    """As the admin, onto the list of keys."""
    page.goto(f"{base}/admin/login/?next={CHANGELIST}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")


def check_the_list(page: Any) -> None:
    """Every key, nothing scrolling sideways, the app named once, the ages in words."""
    assert page.locator("#result_list tbody tr").count() == 9
    assert_fits(page)
    assert words(page.locator(".breadcrumbs").inner_text()) == (
        trail("Home", "Idempotency", "Idempotency keys")
    )
    # The app once in the sidebar, with its keys; no outbox under the db strategy.
    sidebar = page.locator("#nav-sidebar .app-django_idempotency")
    assert words(sidebar.locator("caption").text_content() or "") == "Idempotency"
    assert words(sidebar.locator("tbody").inner_text()) == "Idempotency keys"
    # Ages in words; the exact time on hover.
    assert cell(page, "order-1001-charge", "age") == "7 minutes"
    assert cell(page, "order-1001-charge", "expires") == "in 23 hours"
    assert cell(page, "order-0917-charge", "expires") == "expired 1 day ago"
    assert cell(page, "order-1007-charge", "age") == "1 hour"
    title = page.locator("#result_list tr", has_text="order-1001-charge").locator(
        ".field-age [title]"
    )
    created = timezone.localtime(IdempotencyKey.objects.get(key="order-1001-charge").created_at)
    assert (title.get_attribute("title") or "").startswith(f"{created:%Y-%m-%d %H:%M:%S}")


def check_the_filters(page: Any, base: str) -> None:
    """Status, then expired, then the response class."""
    page.click("#changelist-filter a:text-is('in progress')")
    page.wait_for_url("**status__exact=in_progress**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "order-1007-charge" in rows.first.inner_text()

    page.goto(f"{base}{CHANGELIST}")
    page.click("#changelist-filter details:has(summary:text-is(' By expired ')) a:text-is('Yes')")
    page.wait_for_url("**expired=yes**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "order-0917-charge" in page.locator("#result_list").inner_text()

    page.goto(f"{base}{CHANGELIST}?response_class=4xx")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "order-1006-charge" in page.locator("#result_list").inner_text()


def check_a_key(page: Any, base: str, shown: IdempotencyKey, tmp_path: Path) -> None:
    """Search, and open one key: headers and the indented JSON body."""
    page.goto(f"{base}{CHANGELIST}")
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
    assert words(page.locator(".breadcrumbs").inner_text()) == (
        trail("Home", "Idempotency", "Idempotency keys", "user:41 / order-1001-charge")
    )
    assert_fits(page)
    screenshot(page, tmp_path, "admin-detail.png")


def check_the_release(page: Any, base: str, stuck: IdempotencyKey, tmp_path: Path) -> None:
    """The stuck key's lease in words; its release through the confirmation page."""
    page.goto(f"{base}{CHANGELIST}{stuck.pk}/change/")
    lease = page.locator(".field-lease .readonly").inner_text()
    assert words(lease) == "renewed 1 hour ago (stale: older than LOCK_TIMEOUT, 60 seconds)"
    assert_fits(page)

    page.goto(f"{base}{CHANGELIST}?status__exact=in_progress")
    page.check(f"input[name=_selected_action][value='{stuck.pk}']")
    page.select_option("select[name=action]", "release_stuck_keys")
    page.click("button[name=index]")
    page.wait_for_selector("#release-keys")
    confirmation = page.locator("#content").inner_text()
    assert "order-1007-charge" in confirmation
    assert "renewed 1 hour ago (stale" in words(confirmation)
    assert page.locator("h1").inner_text() == "Release this in-progress key?"
    assert page.locator("input[type=submit]").get_attribute("value") == "Yes, release it"
    assert words(page.locator(".breadcrumbs").inner_text()).endswith(
        trail("Idempotency keys", "Release an in-progress key")
    )
    assert IdempotencyKey.objects.filter(pk=stuck.pk).exists()  # not before confirming
    assert_fits(page)
    screenshot(page, tmp_path, "admin-release.png")
    page.click("input[type=submit][value='Yes, release it']")
    page.wait_for_selector("ul.messagelist")
    assert "Released 1 in-progress key." in page.locator("ul.messagelist").inner_text()
    assert not IdempotencyKey.objects.filter(pk=stuck.pk).exists()


def test_admin_list_filter_detail_and_release(
    page: Any, live_server: Any, admin_user: Any, tmp_path: Path
) -> None:
    stuck, shown = seed()
    base = live_server.url
    log_in(page, base)
    check_the_list(page)
    screenshot(page, tmp_path, "admin.png")
    check_the_filters(page, base)
    check_a_key(page, base, shown, tmp_path)
    check_the_release(page, base, stuck, tmp_path)
    assert IdempotencyKey.objects.count() == 8


def test_releasing_several_keys_is_asked_in_the_plural(
    page: Any, live_server: Any, admin_user: Any, tmp_path: Path
) -> None:
    """Two keys, each as long as the table allows (255 characters without a space), and
    nothing scrolls sideways: not the list, not a key's page, not the confirmation."""
    longest = ("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" * 4)[:255]
    first = StaleKeyFactory(scope="tenant:" + "x" * 248, key=longest)
    second = StaleKeyFactory(scope="user:43", key="order-2002-charge")
    base = live_server.url
    log_in(page, base)
    assert_fits(page)
    assert longest in words(page.locator("#result_list").inner_text()).replace(" ", "")
    page.goto(f"{base}{CHANGELIST}{first.pk}/change/")
    assert_fits(page)
    page.goto(f"{base}{CHANGELIST}")
    page.check("#action-toggle")  # every key on the page
    page.select_option("select[name=action]", "release_stuck_keys")
    page.click("button[name=index]")
    page.wait_for_selector("#release-keys")
    assert page.locator("h1").inner_text() == "Release these 2 in-progress keys?"
    assert page.locator("input[type=submit]").get_attribute("value") == "Yes, release them"
    assert page.locator("#release-keys tbody tr").count() == 2
    assert_fits(page)
    page.screenshot(path=str(tmp_path / "release-two.png"))
    # "No, take me back" releases nothing.
    page.click("a.cancel-link")
    page.wait_for_selector("#result_list")
    assert set(IdempotencyKey.objects.values_list("pk", flat=True)) == {first.pk, second.pk}
