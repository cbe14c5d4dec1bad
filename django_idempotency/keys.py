"""The Idempotency-Key header, request fingerprints and derived downstream keys."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import string
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

from .errors import InvalidBody, InvalidKey, RequestTooLarge

MAX_KEY_LENGTH = 255
MAX_SCOPE_LENGTH = 255
#: JSON nested deeper than this is fingerprinted by its bytes, not canonicalised.
MAX_JSON_DEPTH = 64


def _is_visible_ascii(value: str) -> bool:
    return all(0x21 <= ord(ch) <= 0x7E for ch in value)


def parse_key(raw: str) -> str:
    """Return the key carried by a header value, or raise InvalidKey.

    Accepts the structured-field string form of RFC 8941 /
    draft-ietf-httpapi-idempotency-key-header (``"abc"``), with any well-formed
    parameters (``"abc";p=1``), which are ignored, and the bare form (``abc``),
    which may not contain ``,`` or ``;``. A list of keys, which is what a header
    sent twice becomes, is refused.
    """
    value = raw.strip(" \t")
    if value.startswith('"'):
        value = _parse_sf_item(value)
    elif "," in value:
        raise InvalidKey(_LIST_OF_KEYS)
    elif ";" in value:
        raise InvalidKey(
            "A bare Idempotency-Key may not contain ';'. Parameters are accepted only "
            'after a quoted key ("key";name=value).'
        )
    if not value:
        raise InvalidKey("The Idempotency-Key header is empty.")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The Idempotency-Key is longer than {MAX_KEY_LENGTH} characters.")
    if not _is_visible_ascii(value):
        raise InvalidKey(
            "The Idempotency-Key may only contain visible ASCII characters "
            "(no spaces or control characters)."
        )
    return value


_LIST_OF_KEYS = (
    "The Idempotency-Key header holds a list of keys (it was sent more than once, or its "
    "value contains a comma); send exactly one key."
)
_KEY = "The quoted Idempotency-Key"
_PARAMETER = "A parameter of the Idempotency-Key"

# RFC 8941 section 3.1.2 (parameter names) and 3.3 (bare items).
_DIGITS = frozenset(string.digits)
_PARAM_NAME_START = frozenset(string.ascii_lowercase + "*")
_PARAM_NAME = _PARAM_NAME_START | _DIGITS | frozenset("_-.")
_TOKEN_START = frozenset(string.ascii_letters + "*")
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~:/")
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/=")


def _parse_sf_item(value: str) -> str:
    """The string of an RFC 8941 Item whose bare item is an sf-string; its
    parameters are checked and ignored (the header defines none)."""
    key, i = _parse_sf_string(value, 0, _KEY)
    n = len(value)
    after = "closing quote"
    while i < n and value[i] == ";":
        i += 1
        while i < n and value[i] == " ":
            i += 1
        i = _skip_parameter_name(value, i)
        if i < n and value[i] == "=":
            i = _skip_bare_item(value, i + 1)
        after = "parameters"
    if i < n:
        if value[i:].lstrip(" \t").startswith(","):
            raise InvalidKey(_LIST_OF_KEYS)
        raise InvalidKey(f"{_KEY} has text after its {after}.")
    return key


def _parse_sf_string(value: str, i: int, subject: str) -> tuple[str, int]:
    """Decode the sf-string that starts at ``value[i]`` (a quote); return it and the
    index after its closing quote."""
    out: list[str] = []
    i += 1
    n = len(value)
    while i < n:
        ch = value[i]
        if ch == "\\":
            if i + 1 >= n or value[i + 1] not in '"\\':
                raise InvalidKey(f"{subject} has an invalid escape.")
            out.append(value[i + 1])
            i += 2
            continue
        if ch == '"':
            return "".join(out), i + 1
        if not 0x20 <= ord(ch) <= 0x7E:
            raise InvalidKey(f"{subject} contains a character that is not ASCII.")
        out.append(ch)
        i += 1
    raise InvalidKey(f"{subject} has no closing quote.")


def _malformed(what: str) -> InvalidKey:
    return InvalidKey(f"The Idempotency-Key has a malformed parameter: {what}.")


def _skip_parameter_name(value: str, i: int) -> int:
    if i >= len(value) or value[i] not in _PARAM_NAME_START:
        raise _malformed("a parameter name starts with a lowercase letter or '*'")
    i += 1
    while i < len(value) and value[i] in _PARAM_NAME:
        i += 1
    return i


def _skip_bare_item(value: str, i: int) -> int:
    """The index after the parameter value (an RFC 8941 bare item) at ``value[i]``."""
    n = len(value)
    ch = value[i] if i < n else ""
    if ch == '"':
        return _parse_sf_string(value, i, _PARAMETER)[1]
    if ch == "-" or ch in _DIGITS:
        return _skip_number(value, i)
    if ch in _TOKEN_START:
        i += 1
        while i < n and value[i] in _TOKEN:
            i += 1
        return i
    if ch == "?":
        if value[i + 1 : i + 2] not in ("0", "1"):
            raise _malformed("a boolean is ?0 or ?1")
        return i + 2
    if ch == ":":
        end = value.find(":", i + 1)
        content = value[i + 1 : end]
        if end < 0 or not _BASE64.issuperset(content):
            raise _malformed("a byte sequence is base64 between colons")
        try:  # padding may be left out
            base64.b64decode(content + "=" * (-len(content) % 4))
        except binascii.Error as exc:
            raise _malformed("a byte sequence is base64 between colons") from exc
        return end + 1
    raise _malformed("a parameter value is a number, string, token, byte sequence or boolean")


def _skip_number(value: str, i: int) -> int:
    """RFC 8941 section 4.2.4: up to 15 digits, or 12 digits, '.' and 1 to 3 digits."""
    n = len(value)
    if value[i] == "-":
        i += 1
    start = i
    while i < n and value[i] in _DIGITS:
        i += 1
    whole = i - start
    if whole == 0 or whole > 15:
        raise _malformed("a number has 1 to 15 digits")
    if i < n and value[i] == ".":
        i += 1
        fraction_start = i
        while i < n and value[i] in _DIGITS:
            i += 1
        if whole > 12 or not 1 <= i - fraction_start <= 3:
            raise _malformed("a decimal number has up to 12 digits, '.' and 1 to 3 digits")
    return i


def _is_json(content_type: str) -> bool:
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


def canonical_json(body: bytes) -> bytes | None:
    """``body`` with object members sorted by name and no whitespace, numbers and
    strings as they were meant; None when it cannot be canonicalised: not UTF-8,
    not JSON, or nested deeper than ``MAX_JSON_DEPTH``."""
    try:
        parsed = _JSON_DECODER.decode(body.decode("utf-8"))
        out: list[str] = []
        _write_json(parsed, out, 0)
    except (ValueError, RecursionError, _TooDeep):
        return None
    return "".join(out).encode("ascii")


def _canonical_pairs(encoded: str) -> bytes:
    """A query string or urlencoded form in name order; the values of a repeated name
    keep their order, which can carry meaning. Percent-escapes that are not UTF-8 are
    kept apart (``%ff`` is not ``%fe``)."""
    pairs = parse_qsl(encoded, keep_blank_values=True, errors="surrogateescape")
    pairs.sort(key=_name)
    return json.dumps(pairs, separators=(",", ":")).encode()


def canonical_body(content_type: str, body: bytes) -> bytes:
    """Bytes that differ only when the body's meaning differs.

    JSON is re-serialised with sorted object members and no whitespace, keeping
    the text of numbers; form bodies are sorted by field name, keeping the order
    of a repeated field's values. Anything else, and JSON that cannot be
    canonicalised, is taken byte for byte.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if body and _is_json(media):
        canonical = canonical_json(body)
        return body if canonical is None else canonical
    if body and media == "application/x-www-form-urlencoded":
        try:
            return _canonical_pairs(body.decode("utf-8"))
        except UnicodeDecodeError:
            return body
    return body


def _is_multipart(request: HttpRequest) -> bool:
    return bool(request.META.get("CONTENT_TYPE", "").lower().startswith("multipart/"))


def _parsed_by_django(request: HttpRequest) -> bool:
    """Django parses multipart bodies into ``request.POST`` and ``FILES`` for POST only,
    streaming the files to its upload handlers; other methods are read whole."""
    return request.method == "POST" and _is_multipart(request)


def preload_body(request: HttpRequest) -> None:
    """Read the body into memory before a framework parses the stream, so the
    fingerprint can still see it. Multipart POST bodies are left to Django's form
    parser. Raises RequestTooLarge (413) past ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    if _parsed_by_django(request):
        return
    try:
        request.body  # noqa: B018 - caches the body on the request
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except RawPostDataException:
        pass


def _parsed_form(request: HttpRequest) -> None:
    """Parse the form body, turning Django's parser errors into problem errors
    (otherwise a malformed multipart body would be a 500)."""
    try:
        request.POST  # noqa: B018 - parses POST and FILES
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except (MultiPartParserError, SuspiciousOperation) as exc:
        # malformed multipart, too many fields (TooManyFieldsSent) or files (TooManyFilesSent)
        raise InvalidBody() from exc


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


def _body_digest(request: HttpRequest) -> bytes:
    django_request: HttpRequest = getattr(request, "_request", request)
    if _parsed_by_django(django_request):
        # Boundaries differ between retries: fingerprint the parsed form and files.
        _parsed_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    content_type = django_request.META.get("CONTENT_TYPE", "")
    try:
        body = django_request.body
    except RequestDataTooBig as exc:
        raise RequestTooLarge() from exc
    except RawPostDataException:
        _parsed_form(django_request)
        return _form_digest(django_request.POST, django_request.FILES)
    if _is_multipart(django_request):
        return _multipart_digest(django_request, body)
    return hashlib.sha256(canonical_body(content_type, body)).digest()


def fingerprint(request: HttpRequest) -> str:
    """SHA-256 (hex) over method, path, canonical query string and canonical body."""
    digest = hashlib.sha256()
    digest.update((request.method or "").upper().encode())
    digest.update(b"\n")
    digest.update(request.path.encode("utf-8", "surrogateescape"))
    digest.update(b"\n")
    digest.update(_canonical_pairs(request.META.get("QUERY_STRING", "")))
    digest.update(b"\n")
    digest.update(_body_digest(request))
    return digest.hexdigest()


def bounded_scope(scope: str) -> str:
    """Scopes longer than the column are stored as their SHA-256."""
    if len(scope) <= MAX_SCOPE_LENGTH:
        return scope
    return "sha256:" + hashlib.sha256(scope.encode()).hexdigest()


def downstream_key(secret: str, scope: str, key: str, name: str = "default") -> str:
    """A key for an outside service, stable across retries of one request.

    Hand it to a payment provider as *its* idempotency key, so that a request
    that lost its lease and was retried is deduplicated by the provider too.
    """
    message = "\x00".join((scope, key, name)).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
