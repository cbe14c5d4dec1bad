"""The admin: read-only pages, filters, escaping and truncation, and the two actions."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone, translation

from django_idempotency import admin as idem_admin
from django_idempotency import models as idem_models
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.fingerprint import fingerprint
from django_idempotency.strategies.hybrid import HybridStrategy
from tests.support.factories import (
    CompletedKeyFactory,
    ExpiredKeyFactory,
    IdempotencyKeyFactory,
    IdempotencyOutboxFactory,
)
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_idempotency_idempotencykey_changelist"
CHANGE = "admin:django_idempotency_idempotencykey_change"


def staff_client(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_idempotency", codename__in=codenames
        )
    )
    client = Client()
    client.force_login(user)
    return client


def run_action(client: Client, action: str, keys: list[IdempotencyKey], **extra: str) -> Any:
    data = {"action": action, "_selected_action": [str(k.pk) for k in keys], **extra}
    return client.post(reverse(CHANGELIST), data, follow=True)


def text(fragment: str) -> str:
    """The visible text of an HTML fragment: tags dropped, entities decoded, whitespace
    (non-breaking spaces too) collapsed to one space."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def cells(page: str, column: str) -> list[str]:
    """The text of each changelist cell of ``column`` (``field-<name>``), top to bottom."""
    found = re.findall(rf'<t[dh] class="field-{column}"[^>]*>(.*?)</t[dh]>', page, re.S)
    return [text(cell) for cell in found]


def trail(*crumbs: str) -> str:
    """A breadcrumb as the admin writes it: the crumbs joined by a single right-pointing
    angle quotation mark."""
    return " \u203a ".join(crumbs)


def breadcrumbs(page: str) -> str:
    """The breadcrumb's text: Django 6.1 writes a list (``<ol class="breadcrumbs">``, its
    separators drawn by CSS), earlier versions a ``<div>`` with the separators in it."""
    if '<div class="breadcrumbs">' in page:
        return text(page.split('<div class="breadcrumbs">', 1)[1].split("</div>", 1)[0])
    items = page.split('<ol class="breadcrumbs">', 1)[1].split("</ol>", 1)[0]
    return trail(*(text(item) for item in re.findall(r"<li[^>]*>(.*?)</li>", items, re.S)))


# -- registration ---------------------------------------------------------------------------


def test_registered_on_the_default_site() -> None:
    assert isinstance(admin.site._registry[IdempotencyKey], idem_admin.IdempotencyKeyAdmin)


def test_admin_enabled_false_registers_nothing() -> None:
    site = admin.AdminSite(name="idem-off")
    with override_settings(IDEMPOTENCY={"ADMIN_ENABLED": False}):
        idem_admin.register(site)
    assert site._registry == {}
    idem_admin.register(site)
    assert IdempotencyKey in site._registry


def test_outbox_is_registered_read_only_when_the_model_exists(
    monkeypatch: pytest.MonkeyPatch, admin_client: Client
) -> None:
    monkeypatch.delattr(idem_models, "IdempotencyOutbox", raising=False)
    site = admin.AdminSite(name="idem-no-outbox")
    idem_admin.register(site)
    assert list(site._registry) == [IdempotencyKey]

    # Any model stands in for the outbox: the guard looks the name up at registration.
    monkeypatch.setattr(idem_models, "IdempotencyOutbox", SideEffect, raising=False)
    site = admin.AdminSite(name="idem-outbox")
    idem_admin.register(site)
    model_admin = site._registry[SideEffect]
    request = admin_client.get("/").wsgi_request
    assert isinstance(model_admin, idem_admin.ReadOnlyAdmin)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)
    assert model_admin.get_readonly_fields(request) == ["id", "label", "created_at"]


def test_the_app_is_named_apart_from_its_model(admin_client: Client) -> None:
    """The breadcrumb reads "Home > Idempotency > Idempotency keys", not the model's
    plural twice."""
    config = apps.get_app_config("django_idempotency")
    assert str(config.verbose_name) == "Idempotency"
    assert str(config.verbose_name).lower() != str(IdempotencyKey._meta.verbose_name_plural)
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert breadcrumbs(page) == trail("Home", "Idempotency", "Idempotency keys")
    key = CompletedKeyFactory(key="k-1")
    page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
    assert breadcrumbs(page) == trail(
        "Home", "Idempotency", "Idempotency keys", f"{key.scope} / k-1"
    )
    index = admin_client.get(reverse("admin:index")).content.decode()
    section = re.search(
        r'<a href="/admin/django_idempotency/" class="section"[^>]*>(.*?)</a>', index
    )
    assert section and text(section.group(1)) == "Idempotency"


OUTBOX_LINK = 'href="/admin/django_idempotency/idempotencyoutbox/"'


class OutboxStrategy(HybridStrategy):
    """A project's own strategy built on ``hybrid``: it writes the outbox too."""


def test_the_outbox_is_listed_only_where_it_can_hold_rows(admin_client: Client) -> None:
    """Under ``db`` (which never writes it) an empty outbox is not listed on the index,
    the app's page or the sidebar; under ``hybrid``, or once it holds rows, it is. Its
    pages answer at their URL either way."""
    pages = [reverse("admin:index"), "/admin/django_idempotency/", reverse(CHANGELIST)]
    outbox = reverse("admin:django_idempotency_idempotencyoutbox_changelist")

    def listed() -> list[bool]:
        return [OUTBOX_LINK in admin_client.get(url).content.decode() for url in pages]

    assert listed() == [False, False, False]
    assert admin_client.get(outbox).status_code == 200
    with override_settings(IDEMPOTENCY={"STRATEGY": "hybrid"}):
        assert listed() == [True, True, True]
    with override_settings(IDEMPOTENCY={"STRATEGY": "tests.test_admin.OutboxStrategy"}):
        assert listed() == [True, True, True]  # a strategy built on hybrid's
    with override_settings(IDEMPOTENCY={"STRATEGY": "advisory_lock"}):
        assert listed() == [False, False, False]
    IdempotencyOutboxFactory()
    assert listed() == [True, True, True]  # rows left by hybrid: they are shown


def test_the_outbox_stays_hidden_from_who_may_not_see_it(django_user_model: Any) -> None:
    client = staff_client(django_user_model, "view_idempotencykey")
    IdempotencyOutboxFactory()
    with override_settings(IDEMPOTENCY={"STRATEGY": "hybrid"}):
        assert OUTBOX_LINK not in client.get(reverse("admin:index")).content.decode()


# -- permissions ----------------------------------------------------------------------------


def test_staff_without_view_permission_is_refused(django_user_model: Any) -> None:
    client = staff_client(django_user_model)
    assert client.get(reverse(CHANGELIST)).status_code == 403


def test_view_permission_lists_and_shows_but_cannot_act(django_user_model: Any) -> None:
    key = IdempotencyKeyFactory()
    client = staff_client(django_user_model, "view_idempotencykey")
    page = client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert key.key in page.content.decode()
    assert "release_stuck_keys" not in page.content.decode()
    assert client.get(reverse(CHANGE, args=[key.pk])).status_code == 200

    response = run_action(client, "release_stuck_keys", [key], post="yes")
    assert response.status_code == 200
    assert IdempotencyKey.objects.filter(pk=key.pk).exists()


def test_nobody_adds_edits_or_deletes_one_record(admin_client: Client) -> None:
    key = CompletedKeyFactory()
    add = reverse("admin:django_idempotency_idempotencykey_add")
    assert admin_client.get(add).status_code == 403
    change = reverse(CHANGE, args=[key.pk])
    response = admin_client.post(change, {"scope": "user:evil", "key": "x", "status": "completed"})
    assert response.status_code == 403
    key.refresh_from_db()
    assert key.scope != "user:evil"
    delete = reverse("admin:django_idempotency_idempotencykey_delete", args=[key.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert IdempotencyKey.objects.filter(pk=key.pk).exists()
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'value="delete_selected"' not in page


# -- list, filters, search ----------------------------------------------------------------


@pytest.mark.parametrize("skew", [90, -90], ids=["app-ahead-90s", "app-behind-90s"])
def test_expiry_in_the_list_is_judged_on_the_database_clock(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, skew: int
) -> None:
    """The expired filter and column, on an app server whose clock is 90 s off: a key with
    30 s left by the database's clock is live, one expired 30 s ago is expired."""
    from django_idempotency.store.clock import DatabaseNow

    for key, left in (("live-by-db", 30), ("expired-by-db", -30)):
        done = CompletedKeyFactory(key=key)
        rows = IdempotencyKey.objects.filter(pk=done.pk)
        rows.update(expires_at=DatabaseNow() + timedelta(seconds=left))
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=skew))

    def keys(**params: str) -> set[str]:
        response = admin_client.get(reverse(CHANGELIST), params)
        assert response.status_code == 200
        return {obj.key for obj in response.context["cl"].result_list}

    assert keys(expired="no") == {"live-by-db"}
    assert keys(expired="yes") == {"expired-by-db"}
    page = admin_client.get(reverse(CHANGELIST), {"o": "-6"}).content.decode()
    assert [cell.split()[0] for cell in cells(page, "expires")] == ["in", "expired"]
    for key, expired in (("live-by-db", "False"), ("expired-by-db", "True")):
        pk = IdempotencyKey.objects.get(key=key).pk
        change = admin_client.get(
            reverse("admin:django_idempotency_idempotencykey_change", args=[pk])
        )
        assert f'alt="{expired}"' in change.content.decode()


def test_list_columns_filters_and_search(admin_client: Client) -> None:
    ok = CompletedKeyFactory(key="key-ok", response_status=201)
    client_error = ExpiredKeyFactory(key="key-4xx", response_status=422)
    server_error = CompletedKeyFactory(key="key-5xx", response_status=503)
    running = IdempotencyKeyFactory(key="key-running", scope="tenant:acme")

    def keys(**params: str) -> set[str]:
        response = admin_client.get(reverse(CHANGELIST), params)
        assert response.status_code == 200
        return {obj.key for obj in response.context["cl"].result_list}

    assert keys() == {ok.key, client_error.key, server_error.key, running.key}
    assert keys(expired="yes") == {client_error.key}
    assert keys(expired="no") == {ok.key, server_error.key, running.key}
    assert keys(response_class="2xx") == {ok.key}
    assert keys(response_class="4xx") == {client_error.key}
    assert keys(response_class="5xx") == {server_error.key}
    assert keys(response_class="none") == {running.key}
    assert keys(status__exact="in_progress") == {running.key}
    assert keys(q="key-5xx") == {server_error.key}
    assert keys(q="tenant:acme") == {running.key}

    # "Show counts": one aggregate with a FILTER per choice.
    facets = admin_client.get(reverse(CHANGELIST), {"_facets": "True"}).content.decode()
    for shown in ("Yes (1)", "No (3)", "2xx (1)", "4xx (1)", "5xx (1)", "No response yet (1)"):
        assert shown in facets

    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    for column in (
        "column-scope",
        "column-key",
        "column-status",
        "column-response_status",
        "column-age",
        "column-expires",
    ):
        assert column in page
    assert '<nav class="toplinks"' in page  # the date hierarchy
    assert 'id="changelist-search"' in page
    assert "expired 1\xa0day ago" in html.unescape(page)  # the expires column of key-4xx


def test_ages_and_expiry_are_human(admin_client: Client) -> None:
    """The list says how old a key is and when it expires ("7 minutes", "in 23 hours",
    "expired 1 day ago"), with the exact time on hover, and sorts by the times."""
    now = timezone.now()
    CompletedKeyFactory(
        key="k-new",
        created_at=now - timedelta(seconds=20),
        expires_at=now + timedelta(hours=23, minutes=50),
    )
    CompletedKeyFactory(
        key="k-week",
        created_at=now - timedelta(days=8, hours=2),
        expires_at=now + timedelta(days=20),
    )
    ExpiredKeyFactory(key="k-gone", created_at=now - timedelta(days=2, minutes=3))
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert cells(page, "key") == ["k-new", "k-gone", "k-week"]  # the newest first
    (new_age, gone_age, week_age) = cells(page, "age")
    assert re.fullmatch(r"2[0-4] seconds", new_age), new_age
    assert [gone_age, week_age] == ["2 days", "1 week"]
    assert cells(page, "expires") == ["in 23 hours", "expired 1 day ago", "in 2 weeks"]
    # The exact time is the cell's title, in the admin's format and time zone.
    created = timezone.localtime(IdempotencyKey.objects.get(key="k-week").created_at)
    assert f'title="{created:%Y-%m-%d %H:%M:%S}' in page
    # "expires" sorts by expires_at: the soonest first.
    index = [column for column in idem_admin.IdempotencyKeyAdmin.list_display].index("expires")
    ordered = admin_client.get(reverse(CHANGELIST), {"o": str(index + 1)}).content.decode()
    assert cells(ordered, "key") == ["k-gone", "k-new", "k-week"]


def test_human_ages_are_localized() -> None:
    """Minutes and longer are Django's own words (``timesince``), translated with the active
    language; under a minute the age counts seconds."""
    assert idem_admin.human_age(timedelta(seconds=1)) == "1\xa0second"
    assert idem_admin.human_age(timedelta(seconds=59.9)) == "59\xa0seconds"
    assert idem_admin.human_age(timedelta(seconds=-3)) == "0\xa0seconds"
    assert idem_admin.human_age(timedelta(minutes=10, seconds=10)) == "10\xa0minutes"
    assert idem_admin.human_age(timedelta(hours=1, minutes=5)) == "1\xa0hour, 5\xa0minutes"
    assert idem_admin.human_age(timedelta(hours=1, minutes=5), depth=1) == "1\xa0hour"
    with translation.override("de"):
        assert idem_admin.human_age(timedelta(minutes=10)) == "10\xa0Minuten"
        assert idem_admin.human_age(timedelta(days=3), depth=1) == "3\xa0Tage"
    with translation.override("fr"):
        assert idem_admin.human_age(timedelta(hours=2)) == "2\xa0heures"


def test_date_hierarchy_drills_down(admin_client: Client) -> None:
    old = IdempotencyKeyFactory(created_at=timezone.now() - timedelta(days=400))
    new = IdempotencyKeyFactory()
    now = timezone.now()
    response = admin_client.get(reverse(CHANGELIST), {"created_at__year": str(now.year)})
    shown = {obj.pk for obj in response.context["cl"].result_list}
    assert new.pk in shown
    assert old.pk not in shown


# -- the detail page -----------------------------------------------------------------------


def test_detail_shows_headers_and_indented_json(admin_client: Client) -> None:
    key = CompletedKeyFactory(
        response_headers={"Content-Type": "application/json", "Location": "/charges/7"},
        response_body=b'{"id":7,"amount":1250,"nested":{"ok":true}}',
    )
    page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
    assert "<th>Location</th><td>/charges/7</td>" in page
    assert "{\n  &quot;id&quot;: 7,\n  &quot;amount&quot;: 1250,\n  &quot;nested&quot;: {" in page
    assert "JSON, 43 bytes" in page
    assert 'name="_save"' not in page  # read-only: no save button


def test_detail_shows_the_lease_as_a_human_age(admin_client: Client) -> None:
    now = timezone.now()
    fresh = IdempotencyKeyFactory(locked_at=now - timedelta(seconds=12))
    stale = IdempotencyKeyFactory(locked_at=now - timedelta(minutes=10, seconds=10))

    def lease(key: IdempotencyKey) -> str:
        page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
        (shown,) = re.findall(r'<div class="readonly">(renewed .*?)</div>', page)
        return text(shown)

    assert re.fullmatch(r"renewed 1[2-6] seconds ago", lease(fresh)), lease(fresh)
    assert lease(stale) == ("renewed 10 minutes ago (stale: older than LOCK_TIMEOUT, 60 seconds)")
    page = admin_client.get(reverse(CHANGE, args=[stale.pk])).content.decode()
    assert "0:10:10" not in page
    assert re.search(r"10\xa0minutes ago", html.unescape(page))


def test_detail_escapes_everything(admin_client: Client) -> None:
    key = CompletedKeyFactory(
        key="<b>k</b>",
        scope="user:<i>1</i>",
        request_path="/x?<script>alert(1)</script>",
        response_headers={"Content-Type": "text/html", "X-<evil>": "<img src=x onerror=alert(1)>"},
        response_body=b"<script>alert('body')</script>",
    )
    page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
    assert "<script>alert" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "X-&lt;evil&gt;" in page
    assert "&lt;b&gt;k&lt;/b&gt;" in page
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "<b>k</b>" not in listing


def test_detail_shows_binary_as_hex_with_its_size(admin_client: Client) -> None:
    body = bytes(range(256)) * 8
    key = CompletedKeyFactory(
        response_headers={"Content-Type": "application/octet-stream"}, response_body=body
    )
    page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
    assert "binary, 2048 bytes, first 512 shown" in page
    assert "00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f" in page
    assert "000001f0" in page
    assert "00000200" not in page


def test_detail_truncates_a_large_body(admin_client: Client) -> None:
    limit = idem_admin.BODY_DISPLAY_LIMIT
    body = json.dumps({"items": ["x" * 100] * 2000}).encode()
    key = CompletedKeyFactory(response_body=body)
    page = admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode()
    assert f"JSON, {len(body)} bytes, truncated to the first {limit} characters" in page
    assert page.count("x" * 100) < 2000


# -- render_body on its own --------------------------------------------------------------------


def test_render_body_kinds() -> None:
    assert idem_admin.render_body(None) == ("empty", "")
    assert idem_admin.render_body(b"[1, 2]") == ("JSON, 6 bytes", "[\n  1,\n  2\n]")
    assert idem_admin.render_body(b"plain text") == ("text, 10 bytes", "plain text")
    assert idem_admin.render_body(memoryview(b"{not json")) == ("text, 9 bytes", "{not json")
    kind, text = idem_admin.render_body(b"\x00\x01abc")
    assert kind == "binary, 5 bytes"
    assert text.startswith("00000000  00 01 61 62 63")
    # A multi-byte character cut by the display limit is still text.
    body = ("é" * (idem_admin.BODY_DISPLAY_LIMIT * 3)).encode()
    kind, text = idem_admin.render_body(body, {"Content-Type": "text/plain"})
    assert kind.startswith(f"text, {len(body)} bytes, truncated")
    assert text == "é" * idem_admin.BODY_DISPLAY_LIMIT


# -- actions -----------------------------------------------------------------------------------


def test_release_action_asks_then_releases_only_in_progress_keys(admin_client: Client) -> None:
    stuck = IdempotencyKeyFactory(locked_at=timezone.now() - timedelta(minutes=10), key="<stuck>")
    done = CompletedKeyFactory()

    confirm = run_action(admin_client, "release_stuck_keys", [stuck, done])
    assert confirm.templates[0].name == (
        "admin/django_idempotency/idempotencykey/release_confirmation.html"
    )
    page = confirm.content.decode()
    assert "&lt;stuck&gt;" in page
    assert "<stuck>" not in page
    assert "stale: older than LOCK_TIMEOUT" in page
    assert "renewed 10\xa0minutes ago" in html.unescape(page)
    assert "1 selected key is not in progress and will be left alone." in page
    assert "<h1>Release this in-progress key?</h1>" in page
    assert 'value="Yes, release it"' in page
    assert "release them" not in page and "these" not in page
    assert breadcrumbs(page) == (
        trail("Home", "Idempotency", "Idempotency keys", "Release an in-progress key")
    )
    assert IdempotencyKey.objects.filter(pk=stuck.pk).exists()  # nothing yet

    done_page = run_action(admin_client, "release_stuck_keys", [stuck, done], post="yes")
    assert "Released 1 in-progress key." in done_page.content.decode()
    assert not IdempotencyKey.objects.filter(pk=stuck.pk).exists()
    assert IdempotencyKey.objects.filter(pk=done.pk).exists()
    # The release is in the admin's audit trail, one entry per key.
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id) == (DELETION, str(stuck.pk))
    assert entry.object_repr == f"{stuck.scope} / <stuck>"
    assert entry.get_change_message() == "Released a stuck in-progress key (admin action)."


def test_release_confirmation_of_several_keys_speaks_in_the_plural(admin_client: Client) -> None:
    stuck = IdempotencyKeyFactory.create_batch(3, locked_at=timezone.now() - timedelta(minutes=5))
    page = run_action(admin_client, "release_stuck_keys", stuck).content.decode()
    assert "<h1>Release these 3 in-progress keys?</h1>" in page
    assert 'value="Yes, release them"' in page
    assert "release it" not in page and "this in-progress key" not in page
    assert "not in progress" not in page
    assert breadcrumbs(page).endswith(trail("Idempotency keys", "Release in-progress keys"))
    with translation.override("de"):
        page = run_action(admin_client, "release_stuck_keys", stuck).content.decode()
    # Django's own words are translated in the active language: the ages, the admin's.
    assert html.unescape(page).count("5\xa0Minuten") == 3
    assert "Nein, bitte abbrechen" in page
    assert IdempotencyKey.objects.count() == 3


def test_release_confirmation_with_nothing_to_release(admin_client: Client) -> None:
    done = CompletedKeyFactory()
    page = run_action(admin_client, "release_stuck_keys", [done]).content.decode()
    assert "nothing to release" in page
    assert "<h1>Nothing to release</h1>" in page
    assert "Yes, release" not in page
    assert IdempotencyKey.objects.filter(pk=done.pk).exists()


def test_a_released_key_runs_again(
    admin_client: Client, client: Client, rf: RequestFactory
) -> None:
    """After the release a retry claims the key afresh (the point of releasing it)."""
    headers: dict[str, Any] = {"HTTP_IDEMPOTENCY_KEY": "retry-me"}
    request = rf.post("/t/fn/", b"{}", "application/json", **headers)
    stuck = IdempotencyKeyFactory(
        scope="anonymous", key="retry-me", fingerprint=fingerprint(request)
    )
    assert client.post("/t/fn/", b"{}", "application/json", **headers).status_code == 409
    run_action(admin_client, "release_stuck_keys", [stuck], post="yes")
    assert client.post("/t/fn/", b"{}", "application/json", **headers).status_code == 201
    assert SideEffect.objects.count() == 1


def test_purge_action_deletes_only_expired_keys(django_user_model: Any) -> None:
    client = staff_client(django_user_model, "view_idempotencykey", "delete_idempotencykey")
    old = ExpiredKeyFactory()
    live = CompletedKeyFactory()
    page = run_action(client, "purge_expired_keys", [old, live]).content.decode()
    assert "Purged 1 expired key. 1 key has not expired and was kept." in page
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION
    assert entry.change_message == "Purged 1 expired idempotency key (admin action)."
    assert not IdempotencyKey.objects.filter(pk=old.pk).exists()
    assert IdempotencyKey.objects.filter(pk=live.pk).exists()


def test_delete_expired_pks_in_batches() -> None:
    expired = ExpiredKeyFactory.create_batch(5)
    live = CompletedKeyFactory()
    pks = [k.pk for k in expired] + [live.pk]
    assert IdempotencyKey.objects.delete_expired_pks(pks, batch_size=2) == 5
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [live.pk]


def test_outbox_rows_are_shown_read_only(admin_client: Client) -> None:
    from django_idempotency.models import IdempotencyOutbox

    assert isinstance(admin.site._registry[IdempotencyOutbox], idem_admin.ReadOnlyAdmin)
    row = IdempotencyOutbox.objects.create(
        scope="user:1",
        key="<outbox-key>",
        fingerprint="f" * 64,
        response_status=201,
        response_headers={"Content-Type": "application/json"},
        response_body=b'{"id":1,"note":"<b>x</b>"}',
        expires_at=timezone.now() + timedelta(hours=1),
    )
    changelist = reverse("admin:django_idempotency_idempotencyoutbox_changelist")
    listing = admin_client.get(changelist, {"q": "<outbox-key>"})
    assert listing.status_code == 200
    assert [r.pk for r in listing.context["cl"].result_list] == [row.pk]
    assert "&lt;outbox-key&gt;" in listing.content.decode()
    change = reverse("admin:django_idempotency_idempotencyoutbox_change", args=[row.pk])
    page = admin_client.get(change).content.decode()
    assert (
        "{\n  &quot;id&quot;: 1,\n  &quot;note&quot;: &quot;&lt;b&gt;x&lt;/b&gt;&quot;\n}" in page
    )
    assert 'name="_save"' not in page
    assert admin_client.post(change, {"scope": "user:2"}).status_code == 403
    add = reverse("admin:django_idempotency_idempotencyoutbox_add")
    assert admin_client.get(add).status_code == 403
    page = admin_client.get(changelist).content.decode()
    assert 'value="delete_selected"' not in page


def test_a_key_page_shows_what_the_completer_knows(admin_client: Client) -> None:
    """docs/steps.md, "In the admin": the kept request, the completer's runs, a dead letter."""
    key = IdempotencyKeyFactory(
        steps={
            "fingerprint": "f",
            "done": [{"name": "create", "kind": "local", "result": 1}],
            "request": {"method": "POST", "path": "/pay/"},
            "completer": {"attempts": 5, "dead": True, "reason": "no attempts left"},
        },
        recovery_point="create",
    )
    page = html.unescape(admin_client.get(reverse(CHANGE, args=[key.pk])).content.decode())
    assert "request kept; run 5 times by the completer; dead-lettered: no attempts left" in page
    plain = IdempotencyKeyFactory()
    page = admin_client.get(reverse(CHANGE, args=[plain.pk])).content.decode()
    assert "by the completer" not in page
