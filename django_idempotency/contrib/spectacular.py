"""OpenAPI documentation of the Idempotency-Key protocol with drf-spectacular.

Every DRF view that uses :class:`~django_idempotency.mixins.IdempotencyMixin`
gets, on the methods that honour the header:

* the ``Idempotency-Key`` request header parameter (required when the view
  requires it), with the patterns of its bare and quoted (RFC 8941) forms;
* one ``application/problem+json`` response per status the protocol answers
  with (``400``, ``406``, ``409``, ``413``, ``422``, ``503``), built from the problem types
  in :mod:`django_idempotency.errors`, with ``Retry-After`` on the ``409`` and
  ``503``; the ``400`` also as ``application/json``, DRF's own validation errors;
  what the view declares for a status is kept and added to;
* the ``Idempotent-Replayed`` header on its success responses;
* no ``IdempotencyMixin`` docstring as the description of a view without one.

This module is loaded by the app when ``drf_spectacular`` is in
``INSTALLED_APPS``; its :class:`IdempotencyViewExtension` then applies the above
to each such view, on top of whatever schema class the view uses. Alternatively
(for example to keep the extension off), set
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] =
"django_idempotency.contrib.spectacular.IdempotencyAutoSchema"``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent, get_class, get_doc
from drf_spectacular.settings import spectacular_settings

from ..conf import conf
from ..errors import PROBLEM_BASE, IdempotencyError
from ..mixins import IdempotencyMixin
from ..protocol.header import BYTE_SEQUENCE_PATTERN, MAX_KEY_LENGTH
from ..protocol.options import Options
from ..protocol.problems import PROBLEM_CONTENT_TYPE
from ..protocol.replay import REPLAYED_HEADER

PROBLEM_COMPONENT = "IdempotencyProblem"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "properties": {
        "type": {"type": "string", "format": "uri", "example": PROBLEM_BASE + "key-reused"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
    "required": ["type", "title", "status", "detail"],
}

#: What each status means, ahead of the list of its problem types (built from errors.py).
STATUS_SUMMARIES: dict[int, str] = {
    400: "The Idempotency-Key protocol refused the request before the view ran.",
    406: "The Idempotency-Key's request has completed, but its stored response is in a media "
    "type this request does not accept; do not repeat it: retry accepting that type.",
    409: "The Idempotency-Key's request cannot be answered with its result now: it is still "
    "in progress (retry after Retry-After seconds), its claim was lost (its changes were "
    "rolled back: retry), or it completed without a stored response (do not repeat it).",
    413: "The request body is too large to be fingerprinted.",
    422: "The Idempotency-Key was already used with a different request.",
    503: "A dependency failed and the request was not processed, or its changes were rolled "
    "back; retry with the same Idempotency-Key after Retry-After seconds.",
}

#: Statuses whose answers may carry ``Retry-After``.
RETRY_AFTER_STATUSES = frozenset({409, 503})

#: DRF's own 400s (serializer validation, a parse error) are ``application/json``.
DRF_ERROR_CONTENT_TYPE = "application/json"
DRF_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {},
    "description": "DRF's own error document (validation errors by field, or ``detail``).",
}


def _error_classes() -> list[type[IdempotencyError]]:
    """Every IdempotencyError subclass of the errors module (the problems a request can be
    answered with), in definition order; not another module's (a task's ``TaskKeyReused``
    is never an HTTP answer, and which are imported must not change the schema)."""
    found: list[type[IdempotencyError]] = []
    pending = list(IdempotencyError.__subclasses__())
    while pending:
        cls = pending.pop(0)
        if cls not in found and cls.__module__ == IdempotencyError.__module__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def problems_by_status() -> dict[int, list[type[IdempotencyError]]]:
    """The problem types this app answers with, grouped by status (lowest first)."""
    grouped: dict[int, list[type[IdempotencyError]]] = {}
    for cls in _error_classes():
        grouped.setdefault(cls.status, []).append(cls)
    return dict(sorted(grouped.items()))


def problem_description(status: int, errors: list[type[IdempotencyError]]) -> str:
    """The response description for ``status``: what it means, then each problem type."""
    lines = [STATUS_SUMMARIES.get(status, "An Idempotency-Key problem."), ""]
    lines += [f"- `{error.slug}`: {error.title}." for error in errors]
    if status == 400:
        lines += ["", f"DRF's own 400s (validation errors) come as `{DRF_ERROR_CONTENT_TYPE}`."]
    return "\n".join(lines)


# The Idempotency-Key header value (what header.parse_key accepts, after HTTP's own
# removal of surrounding whitespace), as ECMA-262 patterns that Python's re reads alike.
#: The bare form: 1-255 visible ASCII characters, without ',' or ';', not starting with '"'.
BARE_KEY_PATTERN = r"^[\x21\x23-\x2B\x2D-\x3A\x3C-\x7E][\x21-\x2B\x2D-\x3A\x3C-\x7E]{0,254}$"
_SF_STRING_CHAR = r'(?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\["\\])'
_KEY_CHAR = r'(?:[\x21\x23-\x5B\x5D-\x7E]|\\["\\])'  # a space is not allowed in the key
_BARE_ITEM = (
    r"(?:-?[0-9]{1,12}\.[0-9]{1,3}|-?[0-9]{1,15}"  # decimal, integer
    r'|"' + _SF_STRING_CHAR + r'*"'  # string
    r"|[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*"  # token
    r"|\?[01]"  # boolean
    r"|:" + BYTE_SEQUENCE_PATTERN + r":)"  # byte sequence
)
_PARAMETER = r";[ ]*[a-z*][a-z0-9_.*-]*(?:=" + _BARE_ITEM + r")?"
#: The RFC 8941 sf-string form: 1-255 visible ASCII characters between quotes (``\"``
#: and ``\\`` escaped), optionally followed by parameters, which are ignored.
QUOTED_KEY_PATTERN = r'^"' + _KEY_CHAR + r'{1,255}"(?:' + _PARAMETER + r")*$"

KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "oneOf": [
        {"title": "Bare key", "pattern": BARE_KEY_PATTERN, "maxLength": MAX_KEY_LENGTH},
        {"title": "Quoted key (RFC 8941 sf-string)", "pattern": QUOTED_KEY_PATTERN},
    ],
}


def idempotency_settings(view: Any) -> tuple[frozenset[str], bool]:
    """The methods that honour the header on ``view``, and whether it is required."""
    options = None
    getter = getattr(view, "get_idempotency_options", None)
    if getter is not None:
        try:
            options = getter(getattr(view, "request", None))
        except Exception:  # a hook that needs a real request: fall back to the attributes
            options = None
    methods = options.methods if options is not None else None
    required = options.required if options is not None else None
    if methods is None:
        methods = Options(methods=getattr(view, "idempotency_methods", None)).methods
    if required is None:
        required = getattr(view, "idempotency_required", None)
    resolved = Options(methods=methods, required=required).resolve()
    return resolved.methods, bool(resolved.required)


class IdempotencySchemaMixin:
    """Adds the Idempotency-Key parameter, problem responses and replay header to an
    operation of a view that uses ``IdempotencyMixin``; other views are untouched."""

    view: Any
    method: str
    registry: Any

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)  # type: ignore[misc]
        if operation is None or not isinstance(self.view, IdempotencyMixin):
            return operation
        methods, required = idempotency_settings(self.view)
        if self.method.upper() not in methods:
            return operation
        self._add_key_parameter(operation, required)
        self._add_problem_responses(operation)
        self._add_replayed_header(operation)
        return operation

    def get_description(self, *args: Any, **kwargs: Any) -> str:
        """The operation's description, never ``IdempotencyMixin``'s own docstring, which
        drf-spectacular would otherwise take (from the view's bases) for a view without
        one; the next docstring in the bases is used instead, as for any other view."""
        description: str = super().get_description(*args, **kwargs)  # type: ignore[misc]
        if not isinstance(self.view, IdempotencyMixin) or description != get_doc(IdempotencyMixin):
            return description
        mro = type(self.view).__mro__
        barrier = min(
            (mro.index(c) for c in spectacular_settings.GET_LIB_DOC_EXCLUDES() if c in mro),
            default=len(mro),
        )
        for cls in mro[:barrier]:
            if cls.__doc__ and cls is not IdempotencyMixin:
                return get_doc(cls)
        return ""

    def _add_key_parameter(self, operation: dict[str, Any], required: bool) -> None:
        header = conf.HEADER
        parameters = operation.setdefault("parameters", [])
        if any(
            p.get("in") == "header" and str(p.get("name", "")).lower() == header.lower()
            for p in parameters
        ):
            return  # documented by hand already
        field = conf.KEY_BODY_FIELD
        description = (
            "A unique key per operation (a UUID, for example), sent again unchanged "
            "with every retry of the same request. The first request with a key runs; "
            "a retry gets the stored response (with Idempotent-Replayed: true); a "
            "concurrent duplicate gets 409; the same key with a different request "
            "gets 422."
        )
        if field is not None:
            # The body may carry the key instead: the header alone is never required.
            description += (
                f' The key may be sent in the "{field}" field of a JSON body instead (the same '
                "key in both, if both are sent)"
                + ("; one of the two is required." if required else ".")
            )
        if not required:
            description += " Optional: without it the request is not deduplicated."
        parameters.append(
            {
                "in": "header",
                "name": header,
                "required": required and field is None,
                "schema": copy.deepcopy(KEY_SCHEMA),
                "description": description,
            }
        )

    def _problem_ref(self) -> dict[str, str]:
        component = ResolvedComponent(  # type: ignore[no-untyped-call]
            name=PROBLEM_COMPONENT,
            type=ResolvedComponent.SCHEMA,
            object=PROBLEM_COMPONENT,
            schema=PROBLEM_SCHEMA,
        )
        self.registry.register_on_missing(component)
        return component.ref

    def _add_problem_responses(self, operation: dict[str, Any]) -> None:
        """One response per status the protocol answers with. What the view declares
        for a status is kept: its description comes first, its content and headers
        stay, and only the media types and headers it lacks are added."""
        responses = operation.setdefault("responses", {})
        ref = self._problem_ref()
        for status, errors in problems_by_status().items():
            code = str(status)
            content: dict[str, Any] = {
                PROBLEM_CONTENT_TYPE: {
                    "schema": ref,
                    "examples": {
                        error.slug: {
                            "summary": str(error.title),
                            "value": {
                                "type": error().type_uri,
                                "title": str(error.title),
                                "status": status,
                                "detail": str(error.default_detail),
                            },
                        }
                        for error in errors
                    },
                }
            }
            if status == 400:
                content[DRF_ERROR_CONTENT_TYPE] = {"schema": dict(DRF_ERROR_SCHEMA)}
            description = problem_description(status, errors)
            response = responses.get(code)
            if not isinstance(response, dict) or "$ref" in response:
                if response is not None:
                    continue  # a referenced response: the view's own, left as it is
                response = responses[code] = {}
            own = str(response.get("description") or "").strip()
            response["description"] = f"{own}\n\n{description}" if own else description
            merged = response.setdefault("content", {})
            for media_type, entry in content.items():
                merged.setdefault(media_type, entry)
            if status in RETRY_AFTER_STATUSES:
                response.setdefault("headers", {}).setdefault(
                    "Retry-After",
                    {
                        "description": "Seconds to wait before retrying with the same key.",
                        "schema": {"type": "integer"},
                    },
                )

    def _add_replayed_header(self, operation: dict[str, Any]) -> None:
        for code, response in operation.get("responses", {}).items():
            if not str(code).startswith("2") or not isinstance(response, dict):
                continue
            if "$ref" in response:
                continue
            response.setdefault("headers", {})[REPLAYED_HEADER] = {
                "description": "Present (true) when this is the stored response of an "
                "earlier request with the same Idempotency-Key.",
                "schema": {"type": "string", "enum": ["true"]},
            }


class IdempotencyAutoSchema(IdempotencySchemaMixin, AutoSchema):
    """drf-spectacular's AutoSchema with the Idempotency-Key documentation, for
    ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``."""


_with_idempotency: dict[type[Any], type[Any]] = {}


def with_idempotency(schema_class: type[Any]) -> type[Any]:
    """``schema_class`` with :class:`IdempotencySchemaMixin` in front (built once per class)."""
    if issubclass(schema_class, IdempotencySchemaMixin):
        return schema_class
    combined = _with_idempotency.get(schema_class)
    if combined is None:
        combined = _with_idempotency[schema_class] = type(
            f"Idempotency{schema_class.__name__}", (IdempotencySchemaMixin, schema_class), {}
        )
    return combined


def _wrap_handler(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of a handler whose own ``@extend_schema`` schema gets the mixin too."""

    @functools.wraps(handler)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return handler(self, *args, **kwargs)

    schema = handler.kwargs["schema"]  # type: ignore[attr-defined]
    wrapped.kwargs = {**handler.kwargs, "schema": with_idempotency(get_class(schema))}  # type: ignore[attr-defined]
    return wrapped


class IdempotencyViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Documents the protocol on every view that uses ``IdempotencyMixin``."""

    target_class = "django_idempotency.mixins.IdempotencyMixin"
    match_subclasses = True

    def view_replacement(self) -> type[Any]:
        view: type[Any] = self.target
        schema_class = get_class(view.schema)
        if not issubclass(schema_class, AutoSchema):
            return view  # not a drf-spectacular schema: leave the view alone
        attrs: dict[str, Any] = {
            "__module__": view.__module__,
            "__doc__": view.__doc__,
            "__qualname__": view.__qualname__,
            "schema": with_idempotency(schema_class)(),
        }
        for name in dir(view):
            handler = getattr(view, name, None)
            extra = getattr(handler, "kwargs", None)
            if callable(handler) and isinstance(extra, dict) and extra.get("schema") is not None:
                attrs[name] = _wrap_handler(handler)
        return type(view.__name__, (view,), attrs)
