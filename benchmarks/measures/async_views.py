"""Client CPU and wall time per request of an async def view, bare and protected.

Each case sends --requests POSTs through Django's AsyncClient (in one event loop, one request
at a time) to an async view that writes one row (an order of the control project) with the
async ORM:

* bare: the view without the app (the baseline);
* @idempotent, no key: the decorator, the request without a header (the view is awaited
  directly, no thread hop);
* @idempotent, new key: a fresh key per request: claim, the view's transaction and the
  completion in one sync_to_async call, the view through async_to_sync;
* middleware, new key: the same view marked @idempotency_opt_in under IdempotencyMiddleware
  on the async stack;
* sync view, bare / sync view, new key: the same write in a sync view, which Django runs in
  sync_to_async, bare and under @idempotent: the protocol's own cost, without the async
  path's async_to_sync hop.

time.process_time() counts the CPU of every thread of the process (the client, the event
loop, the sync_to_async thread, the lease keeper); the database server's CPU is not counted.
Rounds alternate the cases (the order flips every round); the ratio is the case's CPU over
the bare view's within each round (above 1 costs more). PostgreSQL (a scratch database),
the db strategy.
"""

from __future__ import annotations

import argparse
import time
import uuid
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.inprocess import close_connections, configure
from benchmarks.harness.postgres import django_database, scratch_database
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread

urlpatterns: list[Any] = []


def routes() -> None:
    from django.contrib.auth.models import User
    from django.http import HttpRequest, JsonResponse
    from django.urls import path

    from benchmarks.control.orders.models import Order
    from django_idempotency.decorators import idempotency_opt_in, idempotent

    owner = User.objects.create(username=f"bench-{uuid.uuid4().hex[:8]}")

    async def bare(request: HttpRequest) -> JsonResponse:
        row = await Order._default_manager.acreate(owner=owner, amount=1000, currency="EUR")
        return JsonResponse({"id": row.pk}, status=201)

    async def marked(request: HttpRequest) -> JsonResponse:
        return await bare(request)

    def sync_bare(request: HttpRequest) -> JsonResponse:
        row = Order._default_manager.create(owner=owner, amount=1000, currency="EUR")
        return JsonResponse({"id": row.pk}, status=201)

    urlpatterns.extend(
        [
            path("bare/", bare),
            path("decorated/", idempotent(bare)),
            path("marked/", idempotency_opt_in(marked)),
            path("sync-bare/", sync_bare),
            path("sync-decorated/", idempotent(sync_bare)),
        ]
    )


def clients() -> dict[str, tuple[Any, str, bool]]:
    """Case -> (client, path, whether a fresh key is sent)."""
    from django.test import AsyncClient, override_settings

    # A client's handler builds its middleware chain from the settings of its first
    # request: build each now, under the settings it is for.
    plain = AsyncClient()
    plain.handler.load_middleware(is_async=True)
    with override_settings(MIDDLEWARE=["django_idempotency.middleware.IdempotencyMiddleware"]):
        with_middleware = AsyncClient()
        with_middleware.handler.load_middleware(is_async=True)
    return {
        "bare": (plain, "/bare/", False),
        "@idempotent, no key": (plain, "/decorated/", False),
        "@idempotent, new key": (plain, "/decorated/", True),
        "middleware, new key": (with_middleware, "/marked/", True),
        "sync view, bare": (plain, "/sync-bare/", False),
        "sync view, new key": (plain, "/sync-decorated/", True),
    }


def measure(args: argparse.Namespace) -> Table:
    from asgiref.sync import async_to_sync

    cases = clients()

    async def once(client: Any, url: str, keyed: bool) -> tuple[float, float]:
        started_cpu, started = time.process_time(), time.perf_counter()
        for _ in range(args.requests):
            headers = {"Idempotency-Key": uuid.uuid4().hex} if keyed else {}
            response = await client.post(url, b"{}", "application/json", headers=headers)
            assert response.status_code == 201, response.content
        elapsed_cpu, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
        return elapsed_cpu / args.requests * 1000, elapsed / args.requests * 1000

    for _ in range(2):  # warm up: connections, the middleware chain
        for case in cases.values():
            async_to_sync(once)(*case)
    runs = interleave(
        list(cases), args.rounds, lambda c, _r: async_to_sync(once)(*cases[c]), "flip"
    )
    bare = [cpu for cpu, _wall in runs["bare"]]
    table = Table(
        f"{args.requests} requests x {args.rounds} rounds, per request (PostgreSQL, db strategy)",
        [Column("case"), Column("CPU ms", ".3f"), Column("CPU vs bare", ".2f"),
         Column("wall ms", ".3f")],
    )  # fmt: skip
    for name, results in runs.items():
        cpu = [c for c, _wall in results]
        wall = spread([w for _c, w in results]).median
        table.add(name, spread(cpu).median, ratio(cpu, bare), wall)
    return table


def run(args: argparse.Namespace) -> int:
    print(conditions(f"{args.rounds} rounds of {args.requests} requests per case"), flush=True)
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database())
        stack.callback(close_connections)
        database = django_database(url) | {"CONN_HEALTH_CHECKS": True}
        configure(
            {"default": database},
            apps=["benchmarks.control.orders"],
            idempotency={"STRATEGY": "db"},
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
        )
        routes()
        table = measure(args)
    emit([table], args.json)
    return 0


MEASURE = Measure(__doc__, run, rounds=5, requests=300, quick={"rounds": 3, "requests": 50})
