"""What a view that the completer may finish keeps of its request, and that request sent
again (docs/steps.md, "The completer").

A view declared with ``completer=True`` keeps, in its key's ``steps``, with its first step's
commit (before its first remote call): the method, the path and query, the scheme, the
``Content-Type``, ``Accept``, ``Accept-Language`` and ``Host`` headers, the body and the
primary key of the authenticated user (:func:`kept_request`). Never a credential: not the
``Authorization`` header, no cookie, no session. The row keeps them until the key is purged
(its ``TTL`` over once it completed: the purge keeps a key in progress with steps).

The completer rebuilds that request (:func:`rebuild`) with the key in ``HEADER`` and the
stored user already authenticated (Django's ``request.user``, and DRF's forced
authentication), and calls the view the path resolves to. The engine checks that the
request it reads is the one whose key is being finished (:func:`check_resent`): a view whose
scope the rebuilt request cannot reproduce (a scope from a cookie or a header that was not
kept) is refused before anything is claimed.
"""

from __future__ import annotations

import base64
from typing import Any

from django.http import HttpRequest

from ..conf import conf
from .body import load, parsed_by_django

#: The headers kept, by their ``META`` name.
KEPT_HEADERS = {
    "CONTENT_TYPE": "Content-Type",
    "HTTP_ACCEPT": "Accept",
    "HTTP_ACCEPT_LANGUAGE": "Accept-Language",
    "HTTP_HOST": "Host",
}

#: Where :func:`rebuild` marks a rebuilt request with the scope and key it finishes.
_RESENT = "_idempotency_resent"


class CannotResend(RuntimeError):
    """A kept request that cannot be sent again as it was: running it once more would not
    mend that."""


class NotTheKeptRequest(CannotResend):
    """The rebuilt request reads as another scope or key than the one it was kept for."""


class NothingToResume(CannotResend):
    """The rebuilt request claimed its key afresh: the row it was kept in is gone (deleted by
    someone who reconciled it, or completed and purged since), and running the view would
    run its steps again from the first."""


def kept_request(request: HttpRequest, lock_timeout: float) -> dict[str, Any] | None:
    """What the completer needs to send ``request`` again (the view's ``lock_timeout``
    with it: the completer waits for the lease to lapse); None for a multipart ``POST``,
    whose body Django streams to its upload handlers instead of keeping it."""
    django_request: HttpRequest = getattr(request, "_request", request)
    if parsed_by_django(django_request):
        return None
    meta = django_request.META
    user = getattr(request, "user", None)
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return {
        "method": django_request.method,
        "path": django_request.get_full_path(),
        "secure": django_request.is_secure(),
        "headers": {name: meta[field] for field, name in KEPT_HEADERS.items() if field in meta},
        "body": base64.b64encode(load(django_request).raw).decode("ascii"),
        "user": str(user.pk) if authenticated else None,  # type: ignore[union-attr]
        "lock_timeout": float(lock_timeout),
    }


def rebuild(kept: dict[str, Any], scope: str, key: str) -> HttpRequest:
    """The request ``kept`` describes, carrying ``key`` in ``HEADER``, as its user
    (``CannotResend`` when that user no longer exists), marked for :func:`check_resent`."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory  # only where requests are sent again

    headers = dict(kept.get("headers") or {})
    content_type = headers.pop("Content-Type", "application/octet-stream")
    headers[conf.HEADER] = key
    request = RequestFactory().generic(
        str(kept["method"]),
        str(kept["path"]),
        data=base64.b64decode(kept.get("body") or ""),
        content_type=content_type,
        secure=bool(kept.get("secure")),
        headers=headers,
    )
    user: Any = AnonymousUser()
    if kept.get("user") is not None:
        model = get_user_model()
        user = model._default_manager.filter(pk=kept["user"]).first()
        if user is None:
            raise CannotResend(f"the user {kept['user']!r} who sent the request no longer exists")
        # DRF's Request authenticates a request that carries these as this user.
        request._force_auth_user = user  # type: ignore[attr-defined]
        request._force_auth_token = None  # type: ignore[attr-defined]
    request.user = user
    request._dont_enforce_csrf_checks = True  # type: ignore[attr-defined]  # no browser
    setattr(request, _RESENT, (scope, key))
    return request


def check_resent(request: HttpRequest, scope: str | None, key: str | None) -> None:
    """``NotTheKeptRequest`` when ``request`` (Django's) is one :func:`rebuild` made for
    another scope or key than the ones it reads as (None: it takes no part, or carries no
    key: it would run unprotected)."""
    expected = request.__dict__.get(_RESENT)
    if expected is not None and expected != (scope, key):
        raise NotTheKeptRequest(
            f"the request sent again for scope {expected[0]!r} and key {expected[1]!r} "
            f"reads as scope {scope!r} and key {key!r}: its view takes the scope from "
            "something the completer does not keep"
        )


def check_resumed(request: HttpRequest, kept: Any) -> None:
    """``NothingToResume`` when ``request`` (Django's) is one :func:`rebuild` made and the
    steps its claim found (``kept``: what the key's row keeps beside them) do not hold the
    kept request: the claim is a fresh one, not the resumption of the key the completer
    counted its run on."""
    if _RESENT in request.__dict__ and "request" not in kept:
        scope, key = request.__dict__[_RESENT]
        raise NothingToResume(
            f"the key {key!r} (scope {scope!r}) was removed before the request sent again "
            "claimed it (deleted, or completed and purged): not run again from its first step"
        )
