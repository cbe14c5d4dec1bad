"""``IdempotencyMixin`` for Django REST framework views and viewsets."""

from __future__ import annotations

from contextlib import ExitStack
from functools import lru_cache
from typing import Any

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.views import View
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .browsable import drf_problem_response, render_problem_page
from .conf import conf
from .errors import IdempotencyError, MisplacedIdempotencyMixin
from .protocol.body import preload
from .protocol.engine import ANSWERED, IdempotentRequest, problem_for
from .protocol.header import header_value
from .protocol.keysource import KeyFunc, may_carry_body_key, request_key
from .protocol.options import OPTION_NAMES, Options
from .protocol.scope import default_scope
from .protocol.shards import non_atomic


class _ShortCircuit(Exception):
    """Carries a response out of ``initial()`` past the view's handler."""

    def __init__(self, response: HttpResponseBase) -> None:
        self.response = response
        super().__init__()


class IdempotencyMixin:
    """Honour the Idempotency-Key header; put it before ``APIView`` in the bases.

    The key is claimed after authentication, permission and throttling checks,
    and only when the view has a handler for the method (so a request rejected by
    those, or answered 405, is not stored); the handler runs inside the claim.
    Override the ``get_*`` hooks per view, or set the view's options as class attributes
    (or ``as_view()`` keywords) named ``idempotency_`` + the option's name
    (``idempotency_required = True``, ``idempotency_ttl``...; the options are
    ``protocol.options.Options``'s fields, None or absent: the setting's).
    """

    _idempotency: IdempotentRequest | None
    _idempotency_stack: ExitStack | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_mixin_order(cls)
        conf.validate_view(cls, **declared_options(cls, {}))

    @classmethod
    def as_view(cls, *args: Any, **kwargs: Any) -> Any:
        # as_view(idempotency_lock_timeout=...) overrides the class's options.
        conf.validate_view(cls, **declared_options(cls, kwargs))
        view = super().as_view(*args, **kwargs)  # type: ignore[misc]
        # The app runs the handler in its own transaction (which also stores the response).
        return non_atomic(view)

    # -- hooks ---------------------------------------------------------------------------

    def get_idempotency_options(self, request: Request) -> Options:
        """This view's options, from its ``idempotency_<option>`` attributes (read once
        per request: DRF makes a view instance per request)."""
        options: Options | None = self.__dict__.get("_idempotency_declared")
        if options is None:
            options = self._idempotency_declared = view_options(self)
        return options

    def get_idempotency_scope(self, request: Request) -> str:
        """Whose key this is: the authenticated user by default. Override for tenants
        or API clients; requests of different scopes never see each other's keys."""
        return default_scope(request)

    def get_idempotency_key(self, request: Request) -> str | None:
        """The request's key as the client sent it, or None. By default the ``HEADER``
        header's, or the ``KEY_BODY_FIELD`` of a JSON body's (both validated; they must be
        the same key when both are sent). Override to read the key from elsewhere; what
        it returns is checked as a key is (1 to 255 visible ASCII characters, else a 400
        invalid-key), and None is no key (a 400 missing-key when the view requires one).
        The body is read into memory before it is called, so ``request.data`` is safe."""
        return request_key(request)

    # -- the request path ------------------------------------------------------------------

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._idempotency = None
        try:
            options = self.get_idempotency_options(request)  # type: ignore[arg-type]
            if options.applies_to(request.method) and (
                self._idempotency_key_hook() is not None
                or header_value(request, conf.HEADER) is not None
                or may_carry_body_key(request)
            ):
                # Keep the body for the key and the fingerprint before DRF's parsers (or a
                # permission class reading request.data) consume the stream.
                preload(request)
            # The claim's context (transaction, lease) is entered in initial() and left
            # here; an error from finish() passes through it first, so the view's writes
            # are rolled back before the problem response is built.
            with ExitStack() as stack:
                self._idempotency_stack = stack
                response: HttpResponseBase = super().dispatch(  # type: ignore[misc]
                    request, *args, **kwargs
                )
                idem = self._idempotency
                if idem is not None and idem.claimed:
                    response = idem.finish(response)
        except ANSWERED as exc:
            # A database error raised by the handler and past DRF: the claim's context has
            # rolled back. A transient conflict or a lost connection is a 503; others
            # propagate.
            idem = self._idempotency
            error = problem_for(exc, None if idem is None else idem.attempt.database)
            response = drf_problem_response(error, getattr(self, "request", request))
        finally:
            self._idempotency_stack = None
        # A problem for the browsable API is rendered here, once the claim's lifecycle has
        # ended: a page that cannot be built is answered problem+json, never a 500.
        return render_problem_page(response, self)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        stack = self._idempotency_stack
        if stack is None:  # initial() called outside dispatch()
            return
        if not self._idempotency_has_handler(request):
            # DRF answers 405 next; a request the view cannot handle leaves no claim,
            # so a later request with this key (say, the POST) still runs the view.
            return
        options = self.get_idempotency_options(request)
        key = self._idempotency_key_hook()
        try:
            idem = IdempotentRequest.from_request(
                request,
                self.get_idempotency_scope,  # type: ignore[arg-type]
                options,
                key,
            )
            if idem is None:
                return
            stack.enter_context(idem)
            if idem.claimed:
                self._idempotency = idem
                return
            raise _ShortCircuit(idem.short_circuit())
        except IdempotencyError as error:
            raise _ShortCircuit(drf_problem_response(error, request)) from error

    def _idempotency_key_hook(self) -> KeyFunc | None:
        """The view's own ``get_idempotency_key``, None when it keeps the default one (the
        engine then reads the header and the body field itself)."""
        if type(self).get_idempotency_key is IdempotencyMixin.get_idempotency_key:
            return None
        hook: KeyFunc = self.get_idempotency_key  # type: ignore[assignment]
        return hook

    def _idempotency_has_handler(self, request: Request) -> bool:
        """Whether ``dispatch()`` will find a handler for the method (as DRF looks it up)."""
        method = (request.method or "").lower()
        if method not in self.http_method_names:  # type: ignore[attr-defined]
            return False
        handler = getattr(self, method, None)
        return handler is not None and handler != self.http_method_not_allowed  # type: ignore[attr-defined]

    def handle_exception(self, exc: Exception) -> Response:
        # Typed as DRF's ``APIView.handle_exception`` is, so that a view with this mixin
        # before ``APIView`` type-checks. The short-circuit answer is a Django response;
        # ``dispatch()`` hands it to ``finalize_response()``, which takes any response.
        if isinstance(exc, _ShortCircuit):
            return exc.response  # type: ignore[return-value]
        return super().handle_exception(exc)  # type: ignore[misc,no-any-return]


#: The prefix of the mixin's option attributes: ``idempotency_`` + the option's name.
OPTION_PREFIX = "idempotency_"


# The options as class attributes, None by default (Django's as_view() takes only keywords
# that name an attribute of the class).
for _name in OPTION_NAMES:
    setattr(IdempotencyMixin, OPTION_PREFIX + _name, None)
del _name


def declared_options(view: Any, initkwargs: dict[str, Any]) -> dict[str, Any]:
    """The options a view class (or instance) declares as attributes, or ``as_view()``
    keywords, by option name."""
    return {
        name: initkwargs.get(OPTION_PREFIX + name, getattr(view, OPTION_PREFIX + name, None))
        for name in OPTION_NAMES
    }


#: The option attributes, in ``OPTION_NAMES``' order (``Options``' fields).
OPTION_ATTRIBUTES = tuple(OPTION_PREFIX + name for name in OPTION_NAMES)


def view_options(view: Any) -> Options:
    """The :class:`Options` a view (instance) declares in its attributes: the same object
    for the same values, while they can be a dictionary's key (a list of methods cannot)."""
    values = tuple([getattr(view, attribute, None) for attribute in OPTION_ATTRIBUTES])
    try:
        return _options_of(*values)
    except TypeError:  # unhashable: built for this request alone
        return Options(*values)


@lru_cache(maxsize=256, typed=True)  # typed: ttl=1 and ttl=True stay apart, as declared
def _options_of(*values: Any) -> Options:
    return Options(*values)


def check_mixin_order(cls: type[Any]) -> None:
    """Raise ``MisplacedIdempotencyMixin`` when ``IdempotencyMixin``'s ``dispatch()`` and
    ``initial()`` would never run on view class ``cls``: the mixin comes after ``APIView``
    in its MRO, or ``cls`` is a Django view that is not a DRF ``APIView``. A class that is
    no view yet (a project's own mixin built on this one) passes."""
    mro = cls.__mro__
    if issubclass(cls, APIView):
        if mro.index(IdempotencyMixin) > mro.index(APIView):
            raise MisplacedIdempotencyMixin(
                f"{cls.__module__}.{cls.__qualname__}: IdempotencyMixin must come before "
                "APIView (and any DRF view class) in the bases, as in "
                f"class {cls.__name__}(IdempotencyMixin, APIView); after it, its dispatch() "
                "and initial() never run and the view has no idempotency protection."
            )
    elif issubclass(cls, View):
        raise MisplacedIdempotencyMixin(
            f"{cls.__module__}.{cls.__qualname__}: IdempotencyMixin works on DRF views "
            "(APIView and its subclasses) only; use @idempotent on a plain Django view."
        )
