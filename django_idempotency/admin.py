"""A read-only admin for the idempotency records.

Nobody adds or edits a key here: the list and the detail page need the *view*
permission; the two actions (release stuck in-progress keys, purge expired keys)
need the *delete* permission and go through the manager's methods. Times are shown as
ages in words ("7 minutes", "in 23 hours"), with the exact time on hover. The outbox is
listed only where it can hold rows. ``IDEMPOTENCY["ADMIN_ENABLED"] = False`` leaves the
models unregistered.
"""

from __future__ import annotations

import binascii
import codecs
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import avoid_wrapping, format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from . import models as idempotency_models
from .conf import conf
from .models import IdempotencyKey
from .protocol.keys import downstream_key
from .protocol.steps import CALLING, REMOTE
from .store.clock import DatabaseNow
from .store.purge import kept_on_release
from .strategies import get_strategy

#: Characters of a stored body shown on the detail page; the rest is cut off.
BODY_DISPLAY_LIMIT = 64 * 1024
#: Bytes of a binary body shown as hex.
BINARY_DISPLAY_LIMIT = 512
#: Larger bodies are not parsed as JSON (only their beginning is shown as text).
JSON_PARSE_LIMIT = 2 * 1024 * 1024

RESPONSE_CLASSES = {
    "2xx": (200, 300),
    "3xx": (300, 400),
    "4xx": (400, 500),
    "5xx": (500, 600),
}


# -- rendering a stored response --------------------------------------------------------------


def _content_type(headers: Any) -> str:
    if isinstance(headers, dict):
        for name, value in headers.items():
            if str(name).lower() == "content-type":
                return str(value).lower()
    return ""


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _hexdump(data: bytes) -> str:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexed = binascii.hexlify(chunk, " ").decode("ascii")
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexed:<47}  {text}")
    return "\n".join(lines)


def render_body(body: bytes | memoryview | None, headers: Any = None) -> tuple[str, str]:
    """``(kind, text)`` for a stored body: JSON indented, text as is, binary as hex.

    ``text`` is plain (not yet escaped) and at most about :data:`BODY_DISPLAY_LIMIT`
    characters long; ``kind`` says what was done, e.g. ``"JSON, 120 bytes"``.
    """
    data = bytes(body or b"")
    size = len(data)
    if not data:
        return (str(_("empty")), "")
    shown = _as_json(data, _content_type(headers)) or _as_text(data)
    if shown is None:
        binary = data[:BINARY_DISPLAY_LIMIT]
        if size > len(binary):
            note = gettext("binary, %(size)d bytes, first %(shown)d shown")
        else:
            note = gettext("binary, %(size)d bytes")
        return (note % {"size": size, "shown": len(binary)}, _hexdump(binary))
    kind, text, truncated = shown
    values = {"kind": kind, "size": size, "limit": BODY_DISPLAY_LIMIT}
    if truncated or len(text) > BODY_DISPLAY_LIMIT:
        text = text[:BODY_DISPLAY_LIMIT]
        note = gettext("%(kind)s, %(size)d bytes, truncated to the first %(limit)d characters")
    else:
        note = gettext("%(kind)s, %(size)d bytes")
    return (note % values, text)


def _as_json(data: bytes, content_type: str) -> tuple[str, str, bool] | None:
    """``("JSON", indented, False)`` for a body that parses as JSON, else None."""
    if len(data) > JSON_PARSE_LIMIT or not ("json" in content_type or data[:1] in (b"{", b"[")):
        return None
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return ("JSON", json.dumps(parsed, indent=2, ensure_ascii=False), False)


def _as_text(data: bytes) -> tuple[str, str, bool] | None:
    """``(kind, text, truncated)`` for a UTF-8 body without control characters, else
    None (binary)."""
    head = data[: BODY_DISPLAY_LIMIT * 4]
    try:
        # Incremental: a multi-byte character cut at the end of ``head`` is not an error.
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) == len(data))
    except UnicodeDecodeError:
        return None
    if _CONTROL.search(text):
        return None  # valid UTF-8, but control characters: show it as binary
    return (gettext("text"), text, len(head) < len(data))


def headers_html(headers: Any) -> SafeString | str:
    """Stored response headers as an HTML table (escaped)."""
    if not isinstance(headers, dict) or not headers:
        return "-"
    rows = format_html_join(
        "\n",
        "<tr><th>{}</th><td>{}</td></tr>",
        ((str(name), str(value)) for name, value in sorted(headers.items())),
    )
    return format_html('<table class="idempotency-headers">{}</table>', rows)


def body_html(body: bytes | memoryview | None, headers: Any) -> SafeString:
    """A stored body for the detail page (see :func:`render_body`), escaped."""
    kind, text = render_body(body, headers)
    return format_html(
        '<p class="help">{}</p>'
        '<pre class="idempotency-body" style="max-height:40em;overflow:auto;'
        'white-space:pre-wrap;word-break:break-all">{}</pre>',
        kind,
        text,
    )


# -- times in words ---------------------------------------------------------------------------


def human_age(age: timedelta, depth: int = 2) -> str:
    """``age`` in words, in the active language: under a minute in seconds ("12 seconds"),
    else Django's ``timesince`` ("10 minutes", "1 hour, 5 minutes"), with up to ``depth``
    adjacent units. A negative age is "0 seconds". Each number and its unit are kept
    together by a non-breaking space, as ``timesince`` does."""
    seconds = max(int(age.total_seconds()), 0)
    if seconds < 60:
        return avoid_wrapping(
            ngettext("%(count)d second", "%(count)d seconds", seconds) % {"count": seconds}
        )
    now = timezone.now()
    return timesince(now - timedelta(seconds=seconds), now, depth=depth)


def seconds_text(seconds: float) -> str:
    """A setting's number of seconds as written ("60 seconds", "0.5 seconds")."""
    return avoid_wrapping(
        ngettext("%(count)s second", "%(count)s seconds", 1 if seconds == 1 else 2)
        % {"count": f"{seconds:g}"}
    )


def exact_time(moment: Any) -> str:
    """``moment`` to the second, in the current time zone, for a title to hover on."""
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return f"{moment:%Y-%m-%d %H:%M:%S %Z}".rstrip()


def timed(moment: Any, text: str) -> SafeString:
    """``text`` (an age in words) as an HTML ``<time>`` with the exact ``moment`` in its
    ``datetime`` and, to hover on, its ``title``."""
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', moment.isoformat(), exact_time(moment), text
    )


def expiry_text(expires_at: Any, depth: int = 1, now: Any = None) -> str:
    """ "in 23 hours", or "expired 2 days ago", at ``now`` (by default the app's)."""
    now = now or timezone.now()
    if expires_at <= now:
        return gettext("expired %(age)s ago") % {"age": human_age(now - expires_at, depth)}
    return gettext("in %(age)s") % {"age": human_age(expires_at - now, depth)}


# -- list filters -----------------------------------------------------------------------------


class ConditionFilter(admin.SimpleListFilter):
    """A filter whose choices are plain conditions.

    The facet counts ("Show counts") are computed as ``COUNT(*) FILTER (WHERE …)``
    in one pass, instead of Django's default ``id IN (subquery)`` per choice, which
    degrades to a nested loop on a table with millions of keys.
    """

    def conditions(self) -> dict[str, Q]:
        raise NotImplementedError

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        condition = self.conditions().get(str(self.value()))
        return queryset if condition is None else queryset.filter(condition)

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        conditions = self.conditions()
        return {
            f"{i}__c": Count(pk_attname, filter=conditions[str(value)])
            for i, (value, _title) in enumerate(self.lookup_choices)
            if str(value) in conditions
        }


class ExpiredFilter(ConditionFilter):
    """Expired keys are no longer replayed and wait for the purge."""

    title = _("expired")
    parameter_name = "expired"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def conditions(self) -> dict[str, Q]:
        now = DatabaseNow()  # the store's clock, as the purge judges expiry
        return {"yes": Q(expires_at__lte=now), "no": Q(expires_at__gt=now)}


class ResponseClassFilter(ConditionFilter):
    title = _("response status")
    parameter_name = "response_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(name, name) for name in RESPONSE_CLASSES] + [("none", _("No response yet"))]

    def conditions(self) -> dict[str, Q]:
        found = {
            name: Q(response_status__gte=low, response_status__lt=high)
            for name, (low, high) in RESPONSE_CLASSES.items()
        }
        found["none"] = Q(response_status__isnull=True)
        return found


#: The changelist's parameter naming the key database shown (with several key databases).
DATABASE_PARAMETER = "database"


def shown_database(request: HttpRequest) -> str | None:
    """The key database whose rows the admin shows and acts on, with several key
    databases (``KEY_DATABASES``): the one the changelist's ``database`` parameter names
    (on a key's page, the one its changelist filters preserved), else ``DATABASE``. None
    with one key database: the model's own (``DATABASE_ROUTERS``' ``db_for_read``)."""
    shards = conf.KEY_DATABASES
    if len(shards) < 2:
        return None
    value = request.GET.get(DATABASE_PARAMETER)
    if value is None:
        value = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_PARAMETER)
    return value if value in shards else conf.DATABASE


class DatabaseFilter(admin.SimpleListFilter):
    """Which key database is listed: one at a time (the rows of two databases are never
    one queryset), ``DATABASE`` until another is chosen."""

    title = _("database")
    parameter_name = DATABASE_PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(alias, alias) for alias in conf.KEY_DATABASES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # get_queryset() already reads the chosen database

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        return {}  # one query cannot count the rows of other databases

    def choices(self, changelist: Any) -> Any:
        current = self.value() if self.value() in conf.KEY_DATABASES else conf.DATABASE
        for lookup, title in self.lookup_choices:
            yield {
                "selected": current == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class KeyDatabaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows of the key database :func:`shown_database` names: the list, a row's page and
    the actions (which act on ``queryset.db``)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request)
        alias = shown_database(request)
        return rows if alias is None else rows.using(alias)

    def get_list_filter(self, request: HttpRequest) -> Any:
        found = list(super().get_list_filter(request))
        if len(conf.KEY_DATABASES) > 1:
            found.insert(0, DatabaseFilter)
        return found


# -- IdempotencyKey ---------------------------------------------------------------------------


class IdempotencyKeyAdmin(KeyDatabaseAdmin):
    list_display = (
        "scope",
        "key",
        "status",
        "response_status",
        "age",
        "expires",
    )
    list_display_links = ("key",)
    list_filter = ("status", ExpiredFilter, ResponseClassFilter)
    search_fields = ("key", "scope")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False  # a COUNT(*) over millions of rows on every page is slow
    actions = ["release_stuck_keys", "purge_expired_keys", "forget_unfinished_keys"]
    fieldsets = (
        (None, {"fields": ("scope", "key", "status", "expired", "lease")}),
        (
            _("Request"),
            {"fields": ("request_method", "request_path", "fingerprint", "claim_token")},
        ),
        (
            _("Stored response"),
            {"fields": ("response_status", "stored_headers", "stored_body")},
        ),
        (
            _("Steps"),
            {"fields": ("recovery_point", "steps_done", "completer")},
        ),
        (
            _("Times"),
            {"fields": ("created_at", "age", "locked_at", "completed_at", "expires_at", "expires")},
        ),
    )
    readonly_fields = (
        "recovery_point",
        "steps_done",
        "completer",
        "scope",
        "key",
        "status",
        "expired",
        "lease",
        "request_method",
        "request_path",
        "fingerprint",
        "claim_token",
        "response_status",
        "stored_headers",
        "stored_body",
        "created_at",
        "locked_at",
        "completed_at",
        "expires_at",
        "age",
        "expires",
    )

    class Media:
        css = {"all": ["django_idempotency/admin.css"]}

    # -- permissions: read-only; the actions need "delete" ---------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            # No per-record delete button: deleting a live completed key would let
            # a retry run its side effect again. The actions below are the way.
            return False
        return super().has_delete_permission(request)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # ``action_location``: Django 6.1 passes it (the change form has actions too) and
        # warns about an override without it; 5.2 and 6.0 have no such parameter.
        location = {} if action_location is None else {"action_location": action_location}
        found = super().get_actions(request, **location)
        found.pop("delete_selected", None)
        return found

    # -- columns and fields ---------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Each row comes with the database's now, on which its columns judge expiry and
        # leases as the store does (not the app server's clock).
        rows: QuerySet[Any] = super().get_queryset(request).annotate(database_now=DatabaseNow())
        return rows

    @admin.display(boolean=True, description=_("expired"), ordering="expires_at")
    def expired(self, obj: IdempotencyKey) -> bool:
        return bool(obj.expires_at <= _now(obj))

    @admin.display(description=_("age"), ordering="created_at")
    def age(self, obj: IdempotencyKey) -> SafeString:
        return timed(obj.created_at, human_age(_now(obj) - obj.created_at, depth=1))

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires(self, obj: IdempotencyKey) -> SafeString:
        return timed(obj.expires_at, expiry_text(obj.expires_at, now=_now(obj)))

    @admin.display(description=_("lease"))
    def lease(self, obj: IdempotencyKey) -> str:
        if obj.status != IdempotencyKey.Status.IN_PROGRESS:
            return "-"
        return _lease_text(obj)

    @admin.display(description=_("stored headers"))
    def stored_headers(self, obj: IdempotencyKey) -> SafeString | str:
        return headers_html(obj.response_headers)

    @admin.display(description=_("stored body"))
    def stored_body(self, obj: IdempotencyKey) -> SafeString | str:
        if obj.response_body is None and obj.response_status is None:
            return "-"
        return body_html(obj.response_body, obj.response_headers)

    @admin.display(description=_("steps done"))
    def steps_done(self, obj: IdempotencyKey) -> SafeString | str:
        """The steps of a view that runs in steps, in order: each one's kind, name and
        stored result, with a remote step's downstream key (docs/steps.md); then a remote
        step an earlier attempt called without recording its result, to look up at the
        other service; "-" for a key without steps."""
        steps = obj.steps if isinstance(obj.steps, dict) else {}
        done = steps.get("done") or []
        items = [
            format_html(
                "<li>{} <strong>{}</strong>: <code>{}</code>{}</li>",
                step.get("kind", ""),
                step.get("name", ""),
                json.dumps(step.get("result"), ensure_ascii=False)[:500],
                _downstream(obj, step.get("name", "")) if step.get("kind") == REMOTE else "",
            )
            for step in done
        ]
        calling = steps.get(CALLING)
        if calling and all(step.get("name") != calling for step in done):
            items.append(
                format_html(
                    "<li>{} <strong>{}</strong>: {}{}</li>",
                    REMOTE,
                    calling,
                    gettext("called by an earlier attempt, its result not recorded"),
                    _downstream(obj, calling),
                )
            )
        if not items:
            return "-"
        return format_html("<ol>{}</ol>", format_html_join("", "{}", ((item,) for item in items)))

    @admin.display(description=_("completer"))
    def completer(self, obj: IdempotencyKey) -> str:
        """What the completer knows of the key (docs/steps.md, "The completer"): whether
        its request is kept, the completer's runs of it, and whether it gave it up."""
        steps = obj.steps if isinstance(obj.steps, dict) else {}
        state = steps.get("completer") or {}
        if "request" not in steps and not state:
            return "-"
        runs = int(state.get("attempts", 0))
        text = ngettext(
            "request kept; run %(runs)d time by the completer",
            "request kept; run %(runs)d times by the completer",
            runs,
        ) % {"runs": runs}
        if state.get("dead"):
            text += "; " + gettext("dead-lettered: %(reason)s") % {
                "reason": state.get("reason", "")
            }
        return text

    # -- actions --------------------------------------------------------------------------

    @admin.action(permissions=["delete"], description=_("Release selected stuck in-progress keys"))
    def release_stuck_keys(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> HttpResponse | None:
        """Ask first; on confirmation release the selected in-progress keys.

        A released key may be claimed again by a retry: a key without steps is deleted, a
        key with a recovery point keeps its row and steps and only its claim is given
        back, so that the retry resumes after the steps that committed (docs/steps.md).
        If its original request is in fact still running, that request fails to store
        its response or its next step (its claim token is gone) and rolls that
        transaction back, so the side effect still runs once.
        """
        stuck = list(queryset.filter(status=IdempotencyKey.Status.IN_PROGRESS))
        if request.POST.get("post") == "yes":
            pks = [obj.pk for obj in stuck]
            released = IdempotencyKey.objects.release_stuck(pks, using=queryset.db)
            left = set(
                IdempotencyKey.objects.using(queryset.db)
                .filter(pk__in=pks)
                .values_list("pk", flat=True)
            )
            _log_deletions(
                request,
                [obj for obj in stuck if obj.pk not in left],
                gettext("Released a stuck in-progress key (admin action)."),
            )
            _log_changes(
                request,
                [obj for obj in stuck if obj.pk in left and kept_on_release(obj)],
                gettext(
                    "Released the claim of an in-progress key with steps; its recovery point "
                    "and steps are kept for its retry (admin action)."
                ),
            )
            self.message_user(
                request,
                ngettext(
                    "Released %(count)d in-progress key.",
                    "Released %(count)d in-progress keys.",
                    released,
                )
                % {"count": released},
                messages.SUCCESS if released else messages.WARNING,
            )
            return None
        return self._release_confirmation(request, queryset, stuck)

    def _release_confirmation(
        self,
        request: HttpRequest,
        queryset: QuerySet[IdempotencyKey],
        stuck: list[IdempotencyKey],
    ) -> TemplateResponse:
        """The page that asks, of one key or of several, before anything is released."""
        count = len(stuck)
        if count:
            title = ngettext(
                "Release this in-progress key?", "Release these %(count)d in-progress keys?", count
            ) % {"count": count}
        else:
            title = gettext("Nothing to release")
        return self._confirmation(
            request,
            "release_stuck_keys",
            "release",
            stuck,
            title=title,
            breadcrumb=ngettext(
                "Release an in-progress key", "Release in-progress keys", max(count, 1)
            ),
            confirm=ngettext("Yes, release it", "Yes, release them", count),
            columns=[("age", gettext("age"), self.age), ("lease", gettext("lease"), _lease_text)],
            with_steps=sum(kept_on_release(obj) for obj in stuck),
            skipped=queryset.exclude(status=IdempotencyKey.Status.IN_PROGRESS).count(),
        )

    @admin.action(permissions=["delete"], description=_("Purge selected expired keys"))
    def purge_expired_keys(self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]) -> None:
        """Delete the selected keys that have expired; the others are left alone."""
        pks = list(queryset.values_list("pk", flat=True))
        unfinished = IdempotencyKey.objects.unfinished(using=queryset.db).filter(pk__in=pks)
        with_steps = unfinished.count()
        deleted = IdempotencyKey.objects.delete_expired_pks(pks, using=queryset.db)
        kept = len(pks) - deleted - with_steps
        if deleted:
            _log_summary(
                request,
                ngettext(
                    "Purged %(count)d expired idempotency key (admin action).",
                    "Purged %(count)d expired idempotency keys (admin action).",
                    deleted,
                )
                % {"count": deleted},
            )
        text = ngettext(
            "Purged %(count)d expired key.", "Purged %(count)d expired keys.", deleted
        ) % {"count": deleted}
        if kept:
            text += " " + ngettext(
                "%(kept)d key has not expired and was kept.",
                "%(kept)d keys have not expired and were kept.",
                kept,
            ) % {"kept": kept}
        if with_steps:
            text += " " + ngettext(
                "%(count)d key is in progress with steps and was kept: its retry resumes it.",
                "%(count)d keys are in progress with steps and were kept: their retries "
                "resume them.",
                with_steps,
            ) % {"count": with_steps}
        self.message_user(request, text, messages.SUCCESS if deleted else messages.WARNING)

    @admin.action(
        permissions=["delete"],
        description=_("Delete selected keys in progress with steps, once reconciled"),
    )
    def forget_unfinished_keys(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> HttpResponse | None:
        """Ask first; on confirmation delete the selected keys in progress with steps whose
        lease has lapsed: keys the purge keeps (docs/steps.md, "Keys the purge keeps"),
        once someone has reconciled them. A retry with such a key is then a new request,
        which runs every step again. A key whose lease is live (its request is running),
        or without steps, is left alone; so is one that changed since the page."""
        pks = list(queryset.values_list("pk", flat=True))
        if request.POST.get("post") != "yes":
            forgettable = IdempotencyKey.objects.forgettable(pks, using=queryset.db)
            keys: list[IdempotencyKey] = list(forgettable.annotate(database_now=DatabaseNow()))
            return self._forget_confirmation(request, queryset, keys)
        deleted = IdempotencyKey.objects.delete_unfinished(pks, using=queryset.db)
        _log_deletions(
            request,
            deleted,
            gettext(
                "Deleted an in-progress key with steps, reconciled by hand; a retry with "
                "its key runs its request again (admin action)."
            ),
        )
        self.message_user(
            request,
            ngettext(
                "Deleted %(count)d key in progress with steps.",
                "Deleted %(count)d keys in progress with steps.",
                len(deleted),
            )
            % {"count": len(deleted)},
            messages.SUCCESS if deleted else messages.WARNING,
        )
        return None

    def _forget_confirmation(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey], keys: list[IdempotencyKey]
    ) -> TemplateResponse:
        """The page that asks before keys in progress with steps are deleted: each key's
        steps, with the downstream keys to look up at the other service."""
        count = len(keys)
        title = (
            ngettext(
                "Delete this key in progress with steps?",
                "Delete these %(count)d keys in progress with steps?",
                count,
            )
            % {"count": count}
            if count
            else gettext("Nothing to delete")
        )
        return self._confirmation(
            request,
            "forget_unfinished_keys",
            "forget",
            keys,
            title=title,
            breadcrumb=ngettext(
                "Delete a key in progress with steps",
                "Delete keys in progress with steps",
                max(count, 1),
            ),
            confirm=ngettext("Yes, delete it", "Yes, delete them", count),
            columns=[
                ("steps", gettext("steps done"), self.steps_done),
                ("lease", gettext("lease"), _lease_text),
            ],
            skipped=queryset.count() - count,
        )

    def _confirmation(
        self,
        request: HttpRequest,
        action: str,
        page: str,
        keys: list[IdempotencyKey],
        *,
        columns: list[tuple[str, str, Callable[[IdempotencyKey], Any]]],
        **context: Any,
    ) -> TemplateResponse:
        """The page ``action`` shows before it acts on ``keys`` (``<page>_confirmation.html``,
        which extends ``action_confirmation.html``): scope, key and request of each, then a
        cell per column (its class, heading and value); ``context`` holds the page's title,
        breadcrumb and confirm button, and what its template says besides."""
        opts = self.model._meta
        return TemplateResponse(
            request,
            f"admin/django_idempotency/idempotencykey/{page}_confirmation.html",
            {
                **self.admin_site.each_context(request),
                "subtitle": None,
                "opts": opts,
                "app_label": opts.app_label,
                "headings": [heading for _class, heading, _value in columns],
                "rows": [
                    (obj, [(css, value(obj)) for css, _heading, value in columns]) for obj in keys
                ],
                "selected": [obj.pk for obj in keys],
                "confirmation": f"{page}-confirmation",
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "action_name": action,
                "media": self.media,
                **context,
            },
        )


def _log_deletions(request: HttpRequest, objects: list[IdempotencyKey], message: str) -> None:
    """One admin LogEntry per deleted key (the "Recent actions" and the audit trail)."""
    user_id = request.user.pk
    if objects and user_id is not None:
        LogEntry.objects.log_actions(
            user_id=user_id,
            queryset=objects,
            action_flag=DELETION,
            change_message=message,
        )


def _log_changes(request: HttpRequest, objects: list[IdempotencyKey], message: str) -> None:
    """One admin LogEntry per key changed in place (a released claim that kept its steps)."""
    user_id = request.user.pk
    if objects and user_id is not None:
        LogEntry.objects.log_actions(
            user_id=user_id,
            queryset=objects,
            action_flag=CHANGE,
            change_message=message,
        )


def _log_summary(request: HttpRequest, message: str) -> None:
    """One admin LogEntry for a bulk deletion, without an object of its own."""
    user_id = request.user.pk
    if user_id is None:
        return
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(IdempotencyKey),
        object_id=None,
        object_repr=message[:200],
        action_flag=DELETION,
        change_message=message,
    )


def _now(obj: Any) -> Any:
    """The database's now, read with ``obj`` (``IdempotencyKeyAdmin.get_queryset``); the
    app's for an object read otherwise."""
    return getattr(obj, "database_now", None) or timezone.now()


def _downstream(obj: IdempotencyKey, name: str) -> SafeString:
    """`` (downstream key: <code>…</code>)``: what remote step ``name`` of ``obj`` sends to
    the other service, to look the call up there."""
    key = downstream_key(conf.DOWNSTREAM_KEY_SECRET, obj.scope, obj.key, name)
    return format_html(" ({}: <code>{}</code>)", gettext("downstream key"), key)


def _lease_text(obj: IdempotencyKey) -> str:
    """How long ago the in-progress lease was renewed ("renewed 12 seconds ago"), and
    whether that counts as abandoned."""
    if obj.locked_at is None:
        return str(_("no lease"))
    age = _now(obj) - obj.locked_at
    text = gettext("renewed %(age)s ago") % {"age": human_age(age)}
    if age.total_seconds() >= conf.LOCK_TIMEOUT:
        text += " " + gettext("(stale: older than LOCK_TIMEOUT, %(timeout)s)") % {
            "timeout": seconds_text(conf.LOCK_TIMEOUT)
        }
    return text


# -- IdempotencyOutbox (when the model exists) ------------------------------------------------


class ReadOnlyAdmin(KeyDatabaseAdmin):
    """Every field shown, nothing changeable; stored responses shown as on the key's page."""

    LIST_PREFERRED = ("scope", "key", "response_status", "created_at", "expires_at")
    DISPLAYED = {"response_headers": "stored_headers", "response_body": "stored_body"}

    def _names(self) -> list[str]:
        return [f.name for f in self.model._meta.concrete_fields]

    def get_list_display(self, request: HttpRequest) -> list[str]:  # type: ignore[override]
        names = self._names()
        preferred = [name for name in self.LIST_PREFERRED if name in names]
        return preferred or names[:8]

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        return [name for name in ("key", "scope") if name in self._names()]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:  # type: ignore[override]
        return [self.DISPLAYED.get(name, name) for name in self._names()]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return self.get_fields(request, obj)

    @admin.display(description=_("stored headers"))
    def stored_headers(self, obj: Any) -> SafeString | str:
        return headers_html(obj.response_headers)

    @admin.display(description=_("stored body"))
    def stored_body(self, obj: Any) -> SafeString | str:
        return body_html(obj.response_body, getattr(obj, "response_headers", None))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OutboxAdmin(ReadOnlyAdmin):
    """The hybrid strategy's outbox, read-only. It is listed (on the admin's index, the
    app's page and the sidebar) only where it can hold rows: under a strategy that writes
    it, or while it does. Its pages answer at their URLs in any case."""

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        perms = super().get_model_perms(request)
        if any(perms.values()) and not outbox_in_use(self.get_queryset(request)):
            return dict.fromkeys(perms, False)
        return perms


def outbox_in_use(rows: QuerySet[Any]) -> bool:
    """Whether the configured strategy writes the outbox (``hybrid``, or one built on it),
    or ``rows`` holds some (left by a view's own ``strategy="hybrid"``, or by an earlier
    configuration)."""
    try:
        if get_strategy().uses_outbox:
            return True
    except ImproperlyConfigured:
        pass  # check E006 reports the strategy; the rows still decide
    return rows.exists()


def outbox_model() -> type[models.Model] | None:
    """``IdempotencyOutbox`` if this version of the models has it."""
    model = getattr(idempotency_models, "IdempotencyOutbox", None)
    if isinstance(model, type) and issubclass(model, models.Model):
        return model
    return None


def register(site: admin.AdminSite) -> None:
    """Register the models on ``site`` unless ``IDEMPOTENCY["ADMIN_ENABLED"]`` is False."""
    if not conf.ADMIN_ENABLED:
        return
    site.register(IdempotencyKey, IdempotencyKeyAdmin)
    outbox = outbox_model()
    if outbox is not None:
        site.register(outbox, OutboxAdmin)


register(admin.site)
