"""DRF's browsable API in a real browser (Debian's headless Chromium, Playwright): the quick
start's ModelViewSet (``tests/examples/drf_viewset.py``), logged in with a session.

The browsable API cannot send an ``Idempotency-Key`` header, so its POST to a view that
requires one is a ``400 missing-key``. Both of its forms now show that problem inside the
browsable API's page: the HTML form (a plain form submission, which showed the raw JSON
in place of the page) and the raw-data form (AJAX, which dropped a non-HTML answer and
reloaded the list, so the user saw nothing at all).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_idempotency.errors import MissingKey
from django_idempotency.models import IdempotencyKey
from example_project.payments.models import Charge

from .support.browser import browser_page
from .support.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIST = "/ex/viewset/charges/"


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # The ORM calls this test makes between browser steps are plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with browser_page(1400) as page:
        yield page


@pytest.fixture
def logged_in(page: Any, live_server: Any) -> Any:
    """Alice's session, through DRF's login page, on the viewset's list."""
    user = UserFactory(username="alice")
    user.set_password("pw")
    user.save()
    page.goto(f"{live_server.url}/api-auth/login/?next={LIST}")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(f"**{LIST}")
    assert "HTTP 200 OK" in page.locator(".response-info").inner_text()
    return page


def assert_problem_page(page: Any) -> None:
    """The browser shows the browsable API's page with the 400 missing-key problem."""
    page.wait_for_function(
        "() => (document.querySelector('.response-info') || {}).innerText?.includes('HTTP 400')"
    )
    info = page.locator(".response-info").inner_text()
    assert "HTTP 400 Bad Request" in info
    assert MissingKey().type_uri in info
    assert str(MissingKey.title) in info
    assert page.url.endswith(LIST)
    assert page.locator("#post-generic-content-form").count() == 1  # the page, with its forms
    assert not Charge.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_the_html_form_shows_the_problem_in_the_page(logged_in: Any) -> None:
    page = logged_in
    form = page.locator("#post-object-form form")
    form.locator("input[name=amount]").fill("1999")
    form.locator("input[name=currency]").fill("EUR")
    form.locator("button.btn-primary").click()
    page.wait_for_load_state()
    assert_problem_page(page)


def test_the_raw_data_form_shows_the_problem_in_the_page(logged_in: Any) -> None:
    page = logged_in
    page.click("a[href='#post-generic-content-form']")
    form = page.locator("#post-generic-content-form form")
    form.locator("select[name=_content_type]").select_option("application/json")
    form.locator("textarea[name=_content]").fill('{"amount": 1999, "currency": "EUR"}')
    form.locator("button.btn-primary").click()
    assert_problem_page(page)
