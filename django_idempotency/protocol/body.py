"""Reading a request's body for its key and its fingerprint: within Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``RequestTooLarge``, 413), parseable as the form it says it
is (``InvalidBody``, 400), and whole: a body shorter than its ``Content-Length`` is an
``IncompleteBody`` (400), refused before the key is claimed.

A client that hangs up half-way through its body is handed to Django by a WSGI server such as
gunicorn as a short body, without an error (its reader stops where the stream ends). Claimed,
that part would run the view, or store the view's answer to it, under the key for the whole
``TTL``, and the client's complete retry would be told its key was reused. Under ASGI the
server reports the hang-up as a disconnect and Django calls no view; a server that handed a
short body over would be refused here all the same.
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException

from ..errors import IncompleteBody, InvalidBody, RequestTooLarge


def announced_length(request: HttpRequest) -> int | None:
    """The body's length as the ``Content-Length`` header announced it; None without one
    (or with one Django reads no body for either)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return length if length > 0 else None


def check_whole(request: HttpRequest, received: int) -> None:
    """``IncompleteBody`` when ``received`` bytes are fewer than the body announced."""
    announced = announced_length(request)
    if announced is not None and received < announced:
        raise IncompleteBody(received=received, announced=announced)


def read_body(request: HttpRequest) -> bytes:
    """``request.body`` (Django's request), read into memory and kept there for the view;
    ``RequestTooLarge`` past ``DATA_UPLOAD_MAX_MEMORY_SIZE``, ``IncompleteBody`` when it is
    shorter than announced. ``RawPostDataException`` (something read it as a stream first)
    is the caller's to handle."""
    try:
        body = request.body
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    check_whole(request, len(body))
    return body


def parse_form(request: HttpRequest) -> None:
    """Parse the form body into ``request.POST`` and ``FILES`` (Django's request), turning
    Django's parser errors into problem errors (otherwise a malformed multipart body would be
    a 500); ``IncompleteBody`` when the stream ended before the announced length (Django's
    multipart parser keeps what it got, a file cut short too, and reports nothing)."""
    try:
        request.POST  # noqa: B018 - parses POST and FILES
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except (MultiPartParserError, SuspiciousOperation) as exc:
        # malformed multipart, too many fields (TooManyFieldsSent) or files (TooManyFilesSent)
        raise InvalidBody() from exc
    try:
        check_whole(request, len(request.body))  # read into memory before it was parsed
    except RawPostDataException:
        _check_stream(request)


def _check_stream(request: HttpRequest) -> None:
    """``IncompleteBody`` when the body's stream, read as far as it goes (as Django's form
    parser reads it), ended before the announced length. A reader that stopped early (a
    position short of the length, and more to read) is not taken for a short body."""
    announced = announced_length(request)
    stream = getattr(request, "_stream", None)
    if announced is None or stream is None:
        return
    position = _position(stream)
    if position is not None and position < announced and not stream.read(1):
        raise IncompleteBody(received=position, announced=announced)


def _position(stream: object) -> int | None:
    """How far ``stream`` was read; None when that cannot be told."""
    if isinstance(stream, LimitedStream):  # WSGI, and Django's test clients
        position = getattr(stream, "_pos", None)
        return position if isinstance(position, int) else None
    try:  # ASGI: the spooled file the server wrote the body to
        return int(stream.tell())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
