"""Whose key a request's key is: the scope.

Requests of different scopes never see each other's keys. The default is the authenticated
user; a view's ``get_idempotency_scope`` / ``scope=`` or ``SCOPE_FUNCTION`` can say otherwise
(tenants, API clients). A scope is stored as given up to the column's length, else as its
SHA-256 (:func:`bounded_scope`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from django.http import HttpRequest
from django.utils.crypto import salted_hmac
from django.utils.module_loading import import_string
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..errors import CredentialsNotAuthenticated
from .header import header_value

#: The ``salted_hmac`` salt of the scope of an anonymous request with a credential cookie
#: (a fixed string: another salt would give every such request another scope).
CREDENTIAL_SALT = "django_idempotency.engine.default_scope"

MAX_SCOPE_LENGTH = 255


def bounded_scope(scope: str) -> str:
    """Scopes longer than the column are stored as their SHA-256."""
    if len(scope) <= MAX_SCOPE_LENGTH:
        return scope
    return "sha256:" + hashlib.sha256(scope.encode()).hexdigest()


def default_scope(request: HttpRequest) -> str:
    """``SCOPE_FUNCTION``'s result when set; else ``user:<pk>`` for an authenticated user.

    An anonymous request never shares the scope ``anonymous`` with other callers while it
    carries a credential: one of ``CREDENTIAL_HEADERS`` (credentials that were not
    authenticated before the claim) raises ``CredentialsNotAuthenticated``; one of
    ``CREDENTIAL_COOKIES`` (an anonymous session) scopes it by a keyed hash of the cookie.
    Only a request with neither is ``anonymous``.
    """
    path = conf.SCOPE_FUNCTION
    if path:
        func: Callable[[HttpRequest], str] = import_string(path)
        return str(func(request))
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    for header in conf.CREDENTIAL_HEADERS:
        if header_value(request, header):
            raise CredentialsNotAuthenticated(
                format_lazy(
                    _(
                        "The request carries an {header} header, but it was not authenticated "
                        "before the Idempotency-Key was claimed, so the request was not "
                        "processed."
                    ),
                    header=header,
                )
            )
    for name in conf.CREDENTIAL_COOKIES:
        value = request.COOKIES.get(name)
        if value:
            digest = salted_hmac(CREDENTIAL_SALT, f"{name}\x00{value}", algorithm="sha256")
            return "anonymous:" + digest.hexdigest()
    return "anonymous"
