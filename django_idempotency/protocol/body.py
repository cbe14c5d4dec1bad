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

The one reader of the body for the key and the fingerprint is :func:`load`: the body is read
once into memory (kept there for the view) and its JSON parsed once (:class:`Body`), both
kept on Django's request; :func:`preload` reads it before a framework's parsers consume the
stream. Django's ``RequestDataTooBig`` is turned into ``RequestTooLarge`` here alone.
"""

from __future__ import annotations

import json
from contextlib import suppress
from io import BytesIO
from typing import Any

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, QueryDict
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.http.request import RawPostDataException
from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext_lazy as _

from ..errors import IncompleteBody, InvalidBody, RequestTooLarge

#: Where :func:`load` keeps a request's :class:`Body` (on Django's request).
_LOADED = "_idempotency_body"


def is_json(content_type: str) -> bool:
    """Whether ``content_type`` (a header value, parameters and all) is JSON: ``application/json``
    or a ``+json`` type."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class Number(str):
    """A JSON number, kept as the text it was sent as (``19.990`` is not ``19.99``)."""

    __slots__ = ()


class Object(list[tuple[str, Any]]):
    """A JSON object: its members in the order they were sent, repeated names too."""

    __slots__ = ()


# One decoder for every request: numbers keep their text, objects all their members.
_JSON_DECODER = json.JSONDecoder(
    object_pairs_hook=Object, parse_float=Number, parse_int=Number, parse_constant=Number
)


def parse_json(body: bytes) -> Any:
    """The JSON value of ``body`` (UTF-8), its objects as lists of ``(name, value)`` pairs in
    the order they were sent, repeated names too; numbers as the text they were sent as.
    ``ValueError`` (or ``RecursionError``, nested too deep for Python) when it is not JSON."""
    return _JSON_DECODER.decode(body.decode("utf-8"))


def is_object(value: Any) -> bool:
    """Whether ``value`` (from :func:`parse_json`) is a JSON object."""
    return type(value) is Object


#: A :class:`Body` whose JSON has not been parsed yet.
_UNPARSED: Any = object()


class Body:
    """A body read into memory: its bytes, and its JSON value parsed on first use, once."""

    __slots__ = ("_error", "_parsed", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._parsed: Any = _UNPARSED
        self._error: ValueError | RecursionError | None = None

    def json(self) -> Any:
        """The JSON value (:func:`parse_json`), parsed once: ``ValueError`` or
        ``RecursionError``, each time, when the body is not JSON."""
        if self._parsed is _UNPARSED and self._error is None:
            try:
                self._parsed = parse_json(self.raw)
            except (ValueError, RecursionError) as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._parsed


def load(request: HttpRequest) -> Body:
    """The body of ``request`` (Django's, or DRF's around it), read once: later calls
    answer the same :class:`Body`. ``RequestTooLarge``, ``IncompleteBody`` as
    :func:`read_body`; ``RawPostDataException`` (something read it as a stream first) is
    the caller's to handle."""
    django_request: HttpRequest = getattr(request, "_request", request)
    loaded = getattr(django_request, _LOADED, None)
    if loaded is None:
        loaded = Body(read_body(django_request))
        setattr(django_request, _LOADED, loaded)
    return loaded


def member_values(request: HttpRequest, name: str) -> list[Any] | None:
    """The values of the top-level member ``name`` of the request's JSON body (:func:`load`),
    in the order they were sent: empty when the body is empty, is not a JSON object or has
    no such member; None when it is not JSON. ``RequestTooLarge`` and ``IncompleteBody`` as
    :func:`load`; ``InvalidBody`` when something read the body as a stream before: nothing
    can be told about what it carries, nor can it be fingerprinted."""
    try:
        body = load(request)
    except RawPostDataException as exc:
        raise InvalidBody(_READ_AS_A_STREAM) from exc
    if not body.raw:
        return []
    try:
        parsed = body.json()
    except (ValueError, RecursionError):
        return None
    if not is_object(parsed):
        return []
    return [value for member, value in parsed if member == name]


_READ_AS_A_STREAM = _(
    "The request body was read before its idempotency key, so the key cannot be "
    "read from it and the body cannot be fingerprinted."
)


def parsed_by_django(request: HttpRequest) -> bool:
    """Django parses multipart bodies into ``request.POST`` and ``FILES`` for POST only,
    streaming the files to its upload handlers; other methods are read whole."""
    return request.method == "POST" and is_multipart(request.META.get("CONTENT_TYPE", ""))


def is_multipart(content_type: str) -> bool:
    return content_type.lower().startswith("multipart/")


def preload(request: HttpRequest) -> None:
    """Read the body into memory (:func:`load`) before a framework parses the stream, so
    that the key and the fingerprint can still see it. Multipart POST bodies are left to
    Django's form parser, and a body something read as a stream already is left as it is.
    Raises ``RequestTooLarge`` (413) past ``DATA_UPLOAD_MAX_MEMORY_SIZE``, ``IncompleteBody``
    (400) when it is shorter than its ``Content-Length``."""
    if parsed_by_django(getattr(request, "_request", request)):
        return
    with suppress(RawPostDataException):
        load(request)


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


def parse_multipart(
    request: HttpRequest, body: bytes, handlers: list[FileUploadHandler]
) -> tuple[QueryDict, MultiValueDict[str, UploadedFile[Any]]]:
    """Parse a copy of a multipart body that Django does not parse (any method but POST)
    with ``handlers``; the request's own body and stream are left for the view's parsers.
    ``RequestTooLarge`` and ``InvalidBody`` as :func:`parse_form`."""
    meta = {"CONTENT_TYPE": request.META.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": len(body)}
    try:
        return MultiPartParser(meta, BytesIO(body), handlers, request.encoding).parse()
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise InvalidBody() from exc


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
