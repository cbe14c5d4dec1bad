"""Problem answers, replays and command output in the client's (or the shell's) language,
with the German catalog the package ships (``django_idempotency/locale/de``).

With Django's ``LocaleMiddleware`` a problem answer's ``title`` and ``detail`` follow the
request's ``Accept-Language``, on every entry point (the views of
``tests/support/bodykey.py``), while its ``type`` stays the same URI; without the
middleware they are in ``LANGUAGE_CODE``. A problem answer is never stored, so each retry
gets its own language; a stored response is replayed as it was produced, in its language.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import override_settings
from django.utils import translation
from rest_framework import serializers

from django_idempotency.admin import render_body
from django_idempotency.errors import IdempotencyError, MissingKey
from django_idempotency.management.commands.drain_idempotency_outbox import (
    Command as DrainCommand,
)
from django_idempotency.management.progress import Progress
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.problems import problem_json
from django_idempotency.protocol.replay import REPLAYED_HEADER

from ..protocol.test_keysource import ENTRIES, IDEMPOTENCY_MIDDLEWARE, charge, runs, send
from ..support import bodykey
from ..support.api import token_client
from ..support.assertions import assert_problem
from ..support.factories import ExpiredKeyFactory, UserFactory
from ..support.threads import in_background

pytestmark = pytest.mark.django_db

#: The views of every entry point.
BODYKEY_VIEWS = pytest.mark.urls("tests.support.bodykey")
LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"
LANGUAGES = [("en", "English"), ("de", "German"), ("fr", "French")]


@contextmanager
def localized(
    entry: str | None = None, *, locale: bool = True, **idempotency: Any
) -> Iterator[None]:
    """``LocaleMiddleware`` after the session middleware, as Django documents it (unless
    ``locale`` is false), English, German and French, the key in the body too."""
    middleware = list(settings.MIDDLEWARE)
    if locale:
        middleware.insert(
            middleware.index("django.middleware.common.CommonMiddleware"), LOCALE_MIDDLEWARE
        )
    if entry is not None and entry.startswith("middleware"):
        middleware.append(IDEMPOTENCY_MIDDLEWARE)
    with override_settings(
        MIDDLEWARE=middleware,
        USE_I18N=True,
        LANGUAGE_CODE="en",
        LANGUAGES=LANGUAGES,
        IDEMPOTENCY={"KEY_BODY_FIELD": "idempotency_key", **idempotency},
    ):
        yield


# -- problem answers -----------------------------------------------------------------------------


@BODYKEY_VIEWS
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_missing_key_is_answered_in_the_requests_language(entry: str) -> None:
    with localized(entry, REQUIRED=True):
        german = assert_problem(send(entry, charge(), language="de"), 400, "missing-key")
        english = assert_problem(send(entry, charge(), language="en"), 400, "missing-key")
        french = assert_problem(send(entry, charge(), language="fr"), 400, "missing-key")
    assert german["title"] == "Idempotency-Key-Header erforderlich"
    assert german["detail"] == (
        "Dieser Endpunkt erfordert einen Idempotenzschlüssel: einen Idempotency-Key-Header "
        'oder ein Feld "idempotency_key" in einem JSON-Body.'
    )
    assert english["title"] == "Idempotency-Key header required"
    assert english["detail"].startswith("This endpoint requires an idempotency key")
    assert french["title"] == english["title"]  # no French catalog: the English text
    assert german["type"] == english["type"] == french["type"]
    assert runs(entry) == 0


@BODYKEY_VIEWS
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_reused_key_is_answered_in_each_retrys_language(entry: str) -> None:
    """A 422 is not stored: the same retry asked in German and then in English gets each."""
    with localized(entry):
        assert send(entry, charge("k", amount=1), language="de").status_code == 201
        german = send(entry, charge("k", amount=2), language="de")
        english = send(entry, charge("k", amount=2), language="en")
    de, en = assert_problem(german, 422, "key-reused"), assert_problem(english, 422, "key-reused")
    assert de["title"] == "Idempotency-Key für eine andere Anfrage wiederverwendet"
    assert de["detail"].startswith("Dieser Idempotency-Key wurde bereits")
    assert en["title"] == "Idempotency-Key reused with a different request"
    assert de["type"] == en["type"]
    assert german["Content-Language"] == "de" and english["Content-Language"] == "en"
    assert runs(entry) == 1


@BODYKEY_VIEWS
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_bad_key_is_answered_in_the_requests_language(entry: str) -> None:
    """A detail made of the message and its values (the field, the length) is translated
    whole."""
    with localized(entry):
        long = assert_problem(send(entry, charge("k" * 256), language="de"), 400, "invalid-key")
        header = send(entry, charge(), header="a,b", language="de")
    assert long["title"] == "Ungültiger Idempotency-Key"
    assert long["detail"] == (
        'Der Idempotenzschlüssel im Body-Feld "idempotency_key" ist länger als 255 Zeichen.'
    )
    assert assert_problem(header, 400, "invalid-key")["detail"].startswith(
        "Der Idempotency-Key-Header enthält eine Liste von Schlüsseln"
    )


@BODYKEY_VIEWS
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.django_db(transaction=True)
def test_a_request_in_progress_is_answered_in_the_requests_language(entry: str) -> None:
    bodykey.held.reset()
    body = charge("held", hold=True)
    with localized(entry):
        first = in_background(lambda: send(entry, body, language="en"))
        assert bodykey.held.entered.wait(30)
        german = send(entry, body, language="de")
        bodykey.held.opened.set()
        assert first.result().status_code == 201
    payload = assert_problem(german, 409, "request-in-progress")
    assert payload["title"] == "Eine Anfrage mit diesem Idempotency-Key ist in Bearbeitung"
    assert "Retry-After" in payload["detail"] and payload["detail"].startswith("Eine Anfrage")
    assert german["Retry-After"]
    assert runs(entry) == 1


@BODYKEY_VIEWS
@pytest.mark.parametrize("entry", ["drf-class", "plain", "middleware-asgi"])
def test_without_locale_middleware_problems_are_in_language_code(entry: str) -> None:
    with localized(entry, locale=False, REQUIRED=True):
        english = assert_problem(send(entry, charge(), language="de"), 400, "missing-key")
    assert english["title"] == "Idempotency-Key header required"
    with localized(entry, locale=False, REQUIRED=True), override_settings(LANGUAGE_CODE="de"):
        german = assert_problem(send(entry, charge(), language="en"), 400, "missing-key")
    assert german["title"] == "Idempotency-Key-Header erforderlich"


def test_a_problem_is_translated_when_it_is_rendered_not_when_it_is_raised() -> None:
    """The title and detail are lazy: an error raised under one language and rendered
    under another is in the second (the language of the answer)."""
    with translation.override("en"):
        error = MissingKey()
    with translation.override("de"):
        payload = json.loads(problem_json(error).content)
    assert payload["title"] == "Idempotency-Key-Header erforderlich"
    assert str(error.title) == "Idempotency-Key header required"  # English again, outside
    assert isinstance(IdempotencyError.title, type(MissingKey.title))


# -- replays -----------------------------------------------------------------------------------


def test_a_stored_answer_replays_in_the_language_it_was_produced_in() -> None:
    """DRF's validation errors of the example charge view, produced in German, are stored
    with their Content-Language and replayed as they are to a French and an English retry;
    another body under the key is then a 422 in the retry's own language."""
    client = token_client(UserFactory())
    key = str(uuid.uuid4())

    def post(body: dict[str, Any], language: str) -> Any:
        return client.post(
            "/ex/drf-class/",
            body,
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_ACCEPT_LANGUAGE=language,
        )

    with localized():
        first = post({"currency": "eur"}, "de")
        assert first.status_code == 400
        with translation.override("de"):
            required = str(serializers.Field.default_error_messages["required"])
        assert required != "This field is required."  # DRF's German
        assert json.loads(first.content)["amount"] == [required]
        assert first["Content-Language"] == "de"
        for language in ("fr", "en"):
            retry = post({"currency": "eur"}, language)
            assert retry.headers.get(REPLAYED_HEADER) == "true"
            assert retry.content == first.content
            assert retry["Content-Language"] == "de"
        other = assert_problem(post({"currency": "usd"}, "en"), 422, "key-reused")
        assert other["title"] == "Idempotency-Key reused with a different request"
    assert IdempotencyKey.objects.get().response_headers["Content-Language"] == "de"


# -- commands and the admin --------------------------------------------------------------------


def run(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def test_purge_speaks_the_active_language() -> None:
    ExpiredKeyFactory.create_batch(2)
    with translation.override("de"):
        dry = run("purge_idempotency_keys", "--dry-run", "--older-than", "1s")
        done = run("purge_idempotency_keys", "--batch-size", "1")
        with pytest.raises(CommandError, match="unbekannter Datenbank-Alias 'nowhere'"):
            run("purge_idempotency_keys", "--database", "nowhere")
    assert dry == (
        "Würde 2 abgelaufene Idempotenzschlüssel (vor mehr als 1s abgelaufen) aus der "
        "Datenbank 'default' löschen.\n"
    )
    assert done.startswith(
        "2 abgelaufene Idempotenzschlüssel gelöscht aus der Datenbank 'default' in 2 Stapeln "
        "zu höchstens 1 ("
    )
    assert "längster Stapel" in done


def test_drain_and_its_help_speak_the_active_language() -> None:
    with translation.override("de"):
        report = run("drain_idempotency_outbox")
        command = DrainCommand()
        helptext = command.create_parser("manage.py", "drain_idempotency_outbox").format_help()
    assert report.startswith("0 Outbox-Zeilen übertragen aus der Datenbank 'default'")
    assert "abgelaufen" not in report
    assert "Überträgt die Outbox-Zeilen der Hybrid-Strategie" in helptext
    assert "Zeilen pro Transaktion" in helptext
    assert "(Standard 10 s)" in helptext


def test_progress_lines_group_numbers_as_the_language_does() -> None:
    now = [0.0]
    command = BaseCommand(stdout=io.StringIO())
    with translation.override("de"):
        progress = Progress(
            command,
            verb=translation.pgettext_lazy("progress", "deleted"),
            verbosity=1,
            every=5,
            remaining=lambda: 9000,
            clock=lambda: now[0],
        )
        now[0] = 5
        progress.update(500)
    assert command.stdout._out.getvalue() == (  # type: ignore[attr-defined]
        "500 von etwa 9.500 Zeilen gelöscht, 100 Zeilen/s, noch etwa 1m30s\n"
    )


def test_the_admins_body_notes_are_translated() -> None:
    with translation.override("de"):
        kind, _ = render_body(b"\x00\x01\x02", {})
    assert kind == "binär, 3 Bytes"
