"""The checks of ``IdempotencyMiddleware``'s settings: ``MIDDLEWARE_DEFAULT`` (E101) and its
place in ``MIDDLEWARE`` (E103, E104). Settings only; the views it cannot protect are checked
with the URLconf (:mod:`.urls`)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from ..conf import conf

#: The middleware's dotted path in ``MIDDLEWARE``.
PATH = "django_idempotency.middleware.IdempotencyMiddleware"
#: The values of ``IDEMPOTENCY["MIDDLEWARE_DEFAULT"]``.
MIDDLEWARE_DEFAULTS = ("opt_in", "all")


def validate_middleware_settings() -> list[CheckMessage]:
    """E101: MIDDLEWARE_DEFAULT; E103/E104: the middleware's place in MIDDLEWARE. Settings
    only (the checks of ``settings.IDEMPOTENCY`` list these, and start-up enforces them)."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if PATH not in middleware:
        return []
    messages: list[CheckMessage] = []
    default = conf.MIDDLEWARE_DEFAULT
    if default not in MIDDLEWARE_DEFAULTS:
        messages.append(
            Error(
                f'IDEMPOTENCY["MIDDLEWARE_DEFAULT"] is {default!r}.',
                hint=f"Use one of {', '.join(repr(v) for v in MIDDLEWARE_DEFAULTS)}.",
                id="django_idempotency.E101",
            )
        )
    position = middleware.index(PATH)
    auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
    if auth in middleware and middleware.index(auth) > position:
        messages.append(
            Error(
                "IdempotencyMiddleware is listed before AuthenticationMiddleware: every "
                "request would reach the claim as anonymous.",
                hint="Move IdempotencyMiddleware to the end of MIDDLEWARE.",
                id="django_idempotency.E104",
            )
        )
    for path in middleware[position + 1 :]:
        try:
            later = import_string(path)
        except ImportError:
            continue  # Django reports it when it loads the middleware
        if hasattr(later, "process_view"):
            messages.append(
                Error(
                    f"{path} is listed after IdempotencyMiddleware and has a process_view "
                    "hook, which would not run for the views IdempotencyMiddleware "
                    "protects (it calls them itself).",
                    hint="Move IdempotencyMiddleware to the end of MIDDLEWARE.",
                    id="django_idempotency.E103",
                )
            )
    return messages


#: This module's validators of the settings (see ``settings.SETTINGS_VALIDATORS``).
VALIDATORS = [validate_middleware_settings]
