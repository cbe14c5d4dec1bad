"""Request fingerprints: method, path, query and a canonical body, so that a retry of
the same request matches and any other request does not (see docs/how-it-works.md,
"The request fingerprint")."""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest, QueryDict
from django.http.request import RawPostDataException
from django.utils.datastructures import MultiValueDict

from ..conf import conf
from .body import (
    Body,
    Number,
    Object,
    is_json,
    is_multipart,
    is_object,
    load,
    parse_form,
    parse_multipart,
    parsed_by_django,
)
from .negotiation import format_parameter

#: JSON nested deeper than this is fingerprinted by its bytes, not canonicalised.
MAX_JSON_DEPTH = 64


class _TooDeep(Exception):
    pass


_name = itemgetter(0)
#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder on every call.
_PAIRS_ENCODER = json.JSONEncoder(separators=(",", ":"))
#: The canonical form of an empty query string (no parameters).
_NO_PAIRS = b"[]"


def _write_json(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        out.append(encode_basestring_ascii(value))  # escapes lone surrogates too
    elif kind is Number:
        out.append(value)
    elif kind is Object or kind is list:
        if depth >= MAX_JSON_DEPTH:
            raise _TooDeep
        if kind is Object:
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


def canonical_json(body: bytes | Body, without: str | None = None) -> bytes | None:
    """``body`` with object members sorted by name and no whitespace, numbers and
    strings as they were meant; None when it cannot be canonicalised: not UTF-8,
    not JSON, or nested deeper than ``MAX_JSON_DEPTH``. ``without`` names a member of the
    top-level object that is left out (the key's field, ``KEY_BODY_FIELD``)."""
    try:
        parsed = (body if isinstance(body, Body) else Body(body)).json()
        if without is not None and is_object(parsed):
            parsed = Object(member for member in parsed if member[0] != without)
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


def canonical_body(content_type: str, body: bytes | Body, without: str | None = None) -> bytes:
    """Bytes that differ only when the body's meaning differs.

    JSON is re-serialised with sorted object members and no whitespace, keeping
    the text of numbers, and without the top-level member ``without`` names (the key's own
    field); form bodies are sorted by field name, keeping the order of a repeated field's
    values. Anything else, and JSON that cannot be canonicalised, is taken byte for byte.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    raw = body.raw if isinstance(body, Body) else body
    if raw and is_json(media):
        canonical = canonical_json(body, without=without)
        return raw if canonical is None else canonical
    if raw and media == "application/x-www-form-urlencoded":
        try:
            return _canonical_pairs(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return raw
    return raw


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
    """The digest of a multipart body that Django does not parse (any method but POST),
    parsed from a copy: the request's own body and stream are left for the view's parsers."""
    post, files = parse_multipart(request, body, [_DigestingUploadHandler()])
    return _form_digest(post, files)


def _body_digest(django_request: HttpRequest) -> bytes:
    """The body's part of the fingerprint; ``django_request`` is Django's request (not
    DRF's, whose parsers may have consumed the stream)."""
    content_type = django_request.META.get("CONTENT_TYPE", "")
    if parsed_by_django(django_request):
        # Boundaries differ between retries (Django parses multipart POST bodies): fingerprint
        # the parsed form and files.
        parse_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    try:
        body = load(django_request)
    except RawPostDataException:
        parse_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    if is_multipart(content_type):
        return _multipart_digest(django_request, body.raw)
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
