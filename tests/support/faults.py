"""Views for the fault matrix (``@pytest.mark.urls("tests.support.faults")``).

Every execution of a view takes the next step of ``plan`` (``"ok"`` once the plan is
empty), writes one ``SideEffect`` row labelled with the request's key on the alias
that holds the keys, and answers with that row's id as ``effect``: a response names
the execution that produced it, so a test can tell whether that execution's writes
committed. The views in steps (``/fault/drf-steps/``, ``/fault/fn-steps/``; the matrix's
steps columns, :data:`stepped`) write it in a local step of their own (docs/steps.md): it
commits with the key's recovery point, and a retry after it resumes with the stored row id.
"""

from __future__ import annotations

import io
import json
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.views import APIView

from django_idempotency.conf import conf
from django_idempotency.decorators import idempotent
from django_idempotency.mixins import IdempotencyMixin

from ..testapp.models import SideEffect

#: Steps still to come, one per execution, shared by every thread.
plan: deque[str] = deque()
_plan_lock = threading.Lock()
#: Called by the ``interfere`` step before the write (set by the test).
interference: list[Callable[[str], None]] = []
#: Bodies above this size are not stored (the tests set MAX_STORED_BODY_SIZE to it).
LIMIT = 4096
#: Hooks that already raised once, by key.
_hooks_raised: set[str] = set()
#: Set when an execution of the view begins (a test starts a duplicate only then).
view_started = threading.Event()
#: Every run of the view's body, by key: a ledger outside every transaction, which counts
#: the runs whose writes rolled back too.
runs: Counter[str] = Counter()
#: Whether the requests go to the views in steps (set by the matrix for its steps columns).
stepped = False


class Refused(exceptions.APIException):
    status_code = 409
    default_code = "refused"


def reset() -> None:
    global stepped
    stepped = False
    plan.clear()
    interference.clear()
    _hooks_raised.clear()
    view_started.clear()
    runs.clear()


def _next_step() -> str:
    with _plan_lock:
        return plan.popleft() if plan else "ok"


def _write(key: str) -> int:
    return int(SideEffect.objects.using(conf.DATABASE).create(label=key).pk)


def _payload(effect: int) -> bytes:
    return json.dumps({"effect": effect}).encode()


def execute(key: str, request: Any = None) -> HttpResponseBase:
    """One execution of the view for ``key``: its step, its write and its answer. The
    write is a local step of the request's steps when it has some."""
    steps = getattr(getattr(request, "idempotency", None), "steps", None)
    step = _next_step()
    with _plan_lock:
        runs[key] += 1
    view_started.set()
    if step == "raise_before":
        raise RuntimeError("the view failed before writing")
    if step == "interfere":
        for interfere in interference:
            interfere(key)
    effect = _write(key) if steps is None else steps.local("write", _write, key)
    if step == "interfere_late":  # after the view's write, before its completion
        for interfere in interference:
            interfere(key)
        return HttpResponse(_payload(effect), status=201, content_type="application/json")
    if step == "ok":
        return HttpResponse(_payload(effect), status=201, content_type="application/json")
    if step == "stream":
        chunks = iter([b'{"effect": ', str(effect).encode(), b"}"])
        return StreamingHttpResponse(chunks, status=201, content_type="application/json")
    if step == "file":
        return FileResponse(io.BytesIO(_payload(effect)), status=201)
    if step == "large":
        body = json.dumps({"effect": effect, "pad": "x" * (2 * LIMIT)})
        return HttpResponse(body, status=201, content_type="application/json")
    if step == "hook":
        transaction.on_commit(lambda: _hook_raises_once(key), using=conf.DATABASE)
        return HttpResponse(_payload(effect), status=201, content_type="application/json")
    if step == "refuse":
        raise Refused({"effect": str(effect)})
    if step == "slow_refuse":
        time.sleep(1.0)
        raise Refused({"effect": str(effect)})
    if step == "raise_after":
        raise RuntimeError("the view failed after writing")
    if step == "interfere":
        return HttpResponse(_payload(effect), status=201, content_type="application/json")
    raise AssertionError(f"unknown step {step!r}")


def _hook_raises_once(key: str) -> None:
    if key not in _hooks_raised:
        _hooks_raised.add(key)
        raise ConnectionError("the broker is down (an on_commit hook)")


class FaultView(IdempotencyMixin, APIView):
    idempotency_required = True

    def post(self, request: Request) -> HttpResponseBase:
        return execute(request.headers["Idempotency-Key"], request)


class SteppedFaultView(FaultView):
    idempotency_steps = True


def _fault(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return JsonResponse({}, status=405)
    return execute(request.headers["Idempotency-Key"], request)


fault_function = csrf_exempt(idempotent(required=True)(_fault))
stepped_fault_function = csrf_exempt(idempotent(required=True, steps=True)(_fault))


#: A request that has not ended after this long is taken to hang (a wide margin over every
#: bound the tests set: a loaded machine is slow, a hang is forever).
HANG = 60


class Requester:
    """Requests sent from one thread of its own, whose connection (persistent:
    ``CONN_MAX_AGE``) is opened through the proxy before any fault."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._jobs: queue.Queue[str | None] = queue.Queue()
        self._answers: queue.Queue[Any] = queue.Queue()
        connected = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(connected,), daemon=True)
        self._thread.start()
        assert connected.wait(HANG), "the requester did not connect"

    def _run(self, connected: threading.Event) -> None:
        try:
            connections["default"].ensure_connection()
            connected.set()
            while (key := self._jobs.get()) is not None:
                try:
                    self._answers.put(post(self.client, key))
                except BaseException as exc:
                    self._answers.put(exc)
                finally:
                    # As request_finished does in a server (the test client does not).
                    connections["default"].close_if_unusable_or_obsolete()
        finally:
            connections.close_all()

    def ask(self, key: str) -> Any:
        """The response to one request for ``key``; fails when it hangs."""
        self.send(key)
        return self.answer()

    def send(self, key: str) -> None:
        """Send a request for ``key`` without waiting for its answer (:meth:`answer`)."""
        self._jobs.put(key)

    def answer(self) -> Any:
        """The response to the oldest request sent and not answered yet."""
        try:
            answer = self._answers.get(timeout=HANG)
        except queue.Empty:
            raise AssertionError(f"the request hung for {HANG} s") from None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(HANG)


def settle(requester: Requester, key: str) -> Any:
    """Retry ``key`` until it is no longer in progress (a claim whose outcome was unknown
    holds it until its lease lapses); the final answer."""
    deadline = time.monotonic() + HANG
    while True:
        answer = requester.ask(key)
        if answer.status_code not in (409, 503) or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def url(entry: str = "drf") -> str:
    """The path of the entry point ``entry`` (``drf``, ``fn``), in steps when
    :data:`stepped` is set."""
    return f"/fault/{entry}-steps/" if stepped else f"/fault/{entry}/"


def post(client: Any, key: str, entry: str = "drf") -> Any:
    return client.post(url(entry), b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def new_key() -> str:
    return "fault-" + uuid.uuid4().hex


def body_of(response: Any) -> dict[str, Any]:
    """The JSON of a response, streamed or not."""
    if getattr(response, "streaming", False):
        if not hasattr(response, "_fault_body"):
            response._fault_body = b"".join(response.streaming_content)
        raw = response._fault_body
    else:
        raw = response.content
    return dict(json.loads(raw)) if raw else {}


urlpatterns = [
    path("fault/drf/", FaultView.as_view()),
    path("fault/fn/", fault_function),
    path("fault/drf-steps/", SteppedFaultView.as_view()),
    path("fault/fn-steps/", stepped_fault_function),
]
