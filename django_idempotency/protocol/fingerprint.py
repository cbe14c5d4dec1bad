"""Request fingerprints: method, path, query and a canonical body, so that a retry of
the same request matches and any other request does not (see docs/how-it-works.md,
"The request fingerprint")."""

from __future__ import annotations

import hashlib
import json
from contextlib import suppress
from io import BytesIO
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest, QueryDict
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.http.request import RawPostDataException
from django.utils.datastructures import MultiValueDict

from ..conf import conf
from ..errors import InvalidBody, RequestTooLarge
from .body import parse_form, read_body
from .negotiation import format_parameter

#: JSON nested deeper than this is fingerprinted by its bytes, not canonicalised.
MAX_JSON_DEPTH = 64


def is_json(content_type: str) -> bool:
    """Whether ``content_type`` (a header value, parameters and all) is JSON: ``application/json``
    or a ``+json`` type."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class _Number(str):
    """A JSON number, kept as the text it was sent as (``19.990`` is not ``19.99``)."""

    __slots__ = ()


class _Object(list[tuple[str, Any]]):
    """A JSON object: its members in the order they were sent, repeated names too."""

    __slots__ = ()


class _TooDeep(Exception):
    pass


# One decoder for every request: numbers keep their text, objects all their members.
_JSON_DECODER = json.JSONDecoder(
    object_pairs_hook=_Object, parse_float=_Number, parse_int=_Number, parse_constant=_Number
)
_name = itemgetter(0)
#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder on every call.
_PAIRS_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: The canonical form of an empty query string (no parameters).
_NO_PAIRS = b"[]"


def _write_json(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        out.append(encode_basestring_ascii(value))  # escapes lone surrogates too
    elif kind is _Number:
        out.append(value)
    elif kind is _Object or kind is list:
        if depth >= MAX_JSON_DEPTH:
            raise _TooDeep
        if kind is _Object:
            out.append("{")
            # Stable: members that repeat a name keep their order.
            for i, (name, member) in enumerate(sorted(value, key=_name)):
                if i:
                    out.append(",")
                out.append(encode_basestring_ascii(name))
                out.append(":")
                _write_json(member, out, depth + 1)
            out.append("}")
        else:
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _write_json(item, out, depth + 1)
            out.append("]")
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    else:
        out.append("false")


def parse_json(body: bytes) -> Any:
    """The JSON value of ``body`` (UTF-8), its objects as lists of ``(name, value)`` pairs in
    the order they were sent, repeated names too; numbers as the text they were sent as.
    ``ValueError`` (or ``RecursionError``, nested too deep for Python) when it is not JSON."""
    return _JSON_DECODER.decode(body.decode("utf-8"))


def is_object(value: Any) -> bool:
    """Whether ``value`` (from :func:`parse_json`) is a JSON object."""
    return type(value) is _Object


def canonical_json(body: bytes, without: str | None = None) -> bytes | None:
    """``body`` with object members sorted by name and no whitespace, numbers and
    strings as they were meant; None when it cannot be canonicalised: not UTF-8,
    not JSON, or nested deeper than ``MAX_JSON_DEPTH``. ``without`` names a member of the
    top-level object that is left out (the key's field, ``KEY_BODY_FIELD``)."""
    try:
        parsed = parse_json(body)
        if without is not None and is_object(parsed):
            parsed = _Object(member for member in parsed if member[0] != without)
        out: list[str] = []
        _write_json(parsed, out, 0)
    except (ValueError, RecursionError, _TooDeep):
        return None
    return "".join(out).encode("ascii")


def _canonical_pairs(encoded: str, without: str | None = None) -> bytes:
    """A query string or urlencoded form in name order; the values of a repeated name
    keep their order, which can carry meaning. Percent-escapes that are not UTF-8 are
    kept apart (``%ff`` is not ``%fe``). ``without`` names a parameter left out."""
    pairs = parse_qsl(encoded, keep_blank_values=True, errors="surrogateescape")
    if without is not None:
        pairs = [pair for pair in pairs if pair[0] != without]
    pairs.sort(key=_name)
    return _PAIRS_ENCODER.encode(pairs).encode()


def canonical_body(content_type: str, body: bytes, without: str | None = None) -> bytes:
    """Bytes that differ only when the body's meaning differs.

    JSON is re-serialised with sorted object members and no whitespace, keeping
    the text of numbers, and without the top-level member ``without`` names (the key's own
    field); form bodies are sorted by field name, keeping the order of a repeated field's
    values. Anything else, and JSON that cannot be canonicalised, is taken byte for byte.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if body and is_json(media):
        canonical = canonical_json(body, without=without)
        return body if canonical is None else canonical
    if body and media == "application/x-www-form-urlencoded":
        try:
            return _canonical_pairs(body.decode("utf-8"))
        except UnicodeDecodeError:
            return body
    return body


def _is_multipart(request: HttpRequest) -> bool:
    return _multipart_type(request.META.get("CONTENT_TYPE", ""))


def _multipart_type(content_type: str) -> bool:
    return content_type.lower().startswith("multipart/")


def _parsed_by_django(request: HttpRequest) -> bool:
    """Django parses multipart bodies into ``request.POST`` and ``FILES`` for POST only,
    streaming the files to its upload handlers; other methods are read whole."""
    return request.method == "POST" and _is_multipart(request)


def preload_body(request: HttpRequest) -> None:
    """Read the body into memory before a framework parses the stream, so the
    fingerprint can still see it. Multipart POST bodies are left to Django's form
    parser. Raises RequestTooLarge (413) past ``DATA_UPLOAD_MAX_MEMORY_SIZE``, IncompleteBody
    (400) when it is shorter than its ``Content-Length``."""
    if _parsed_by_django(request):
        return
    with suppress(RawPostDataException):
        read_body(request)


if TYPE_CHECKING:
    _Upload = UploadedFile[Any]
else:
    _Upload = UploadedFile


class _HashedUpload(_Upload):
    """What the digesting upload handler keeps of a file: name, size and SHA-256."""

    def __init__(self, name: str | None, size: int, sha256: bytes) -> None:
        super().__init__(None, name, None, size)
        self.sha256 = sha256


class _DigestingUploadHandler(FileUploadHandler):
    """Hashes each uploaded file as it is parsed and keeps nothing else."""

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self._digest = hashlib.sha256()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self._digest.update(raw_data)

    def file_complete(self, file_size: int) -> UploadedFile[Any]:
        return _HashedUpload(self.file_name, file_size, self._digest.digest())


def _hashed(upload: UploadedFile[Any]) -> _HashedUpload:
    if isinstance(upload, _HashedUpload):
        return upload
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return _HashedUpload(upload.name, upload.size or 0, digest.digest())


def _form_digest(post: QueryDict, files: MultiValueDict[str, UploadedFile[Any]]) -> bytes:
    """Fields in name order, the values of one name in their order, then the files."""
    digest = hashlib.sha256()
    for name, values in sorted(post.lists(), key=itemgetter(0)):
        digest.update(json.dumps([name, values]).encode())
    for name, uploads in sorted(files.lists(), key=itemgetter(0)):
        for upload in uploads:
            hashed = _hashed(upload)
            digest.update(json.dumps([name, hashed.name, hashed.size]).encode())
            digest.update(hashed.sha256)
    return digest.digest()


def _multipart_digest(request: HttpRequest, body: bytes) -> bytes:
    """Parse a copy of a multipart body that Django does not parse (any method but
    POST); the request's own body and stream are left for the view's parsers."""
    meta = {"CONTENT_TYPE": request.META.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": len(body)}
    try:
        parser = MultiPartParser(meta, BytesIO(body), [_DigestingUploadHandler()], request.encoding)
        post, files = parser.parse()
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise InvalidBody() from exc
    return _form_digest(post, files)


def _body_digest(django_request: HttpRequest) -> bytes:
    """The body's part of the fingerprint; ``django_request`` is Django's request (not
    DRF's, whose parsers may have consumed the stream)."""
    content_type = django_request.META.get("CONTENT_TYPE", "")
    multipart = _multipart_type(content_type)
    if multipart and django_request.method == "POST":
        # Boundaries differ between retries (Django parses multipart POST bodies, see
        # _parsed_by_django): fingerprint the parsed form and files.
        parse_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    try:
        body = read_body(django_request)
    except RawPostDataException:
        parse_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    if multipart:
        return _multipart_digest(django_request, body)
    return hashlib.sha256(canonical_body(content_type, body, conf.KEY_BODY_FIELD)).digest()


def fingerprint(request: HttpRequest) -> str:
    """SHA-256 (hex) over method, path, canonical query string and canonical body (a JSON
    body without its ``KEY_BODY_FIELD``: where the key is sent is not part of the request).

    On a DRF view the URL format override (``?format=``) is left out of the query: it
    picks the representation, which a replay is checked against instead
    (``negotiation.retry_accepts``), so that a retry asking for another format is told
    the request has completed rather than that its key was reused."""
    # DRF's Request hands these over from Django's, one lookup each: ask Django's.
    django_request: HttpRequest = getattr(request, "_request", request)
    query = django_request.META.get("QUERY_STRING", "")
    # No query: no format parameter to leave out either.
    pairs = _canonical_pairs(query, without=format_parameter(request)) if query else _NO_PAIRS
    parts = [
        (django_request.method or "").upper().encode(),
        django_request.path.encode("utf-8", "surrogateescape"),
        pairs,
        _body_digest(django_request),
    ]
    return hashlib.sha256(b"\n".join(parts)).hexdigest()  # one update: the same digest
