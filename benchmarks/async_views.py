"""Client CPU and wall time per request of an ``async def`` view, bare and protected.

Each case sends ``--requests`` POSTs through Django's ``AsyncClient`` (in one event
loop, one request at a time) to an async view that writes one row with the async ORM:

* ``bare``: the view without the app;
* ``@idempotent, no key``: the decorator, the request without a header (the view is
  awaited directly, no thread hop);
* ``@idempotent, new key``: a fresh key per request: claim, the view's transaction and
  the completion in one ``sync_to_async`` call, the view through ``async_to_sync``;
* ``middleware, new key``: the same view marked ``@idempotency_opt_in`` under
  ``IdempotencyMiddleware`` on the async stack;
* ``sync view, bare`` / ``sync view, new key``: the same write in a sync view, which
  Django runs in ``sync_to_async``, bare and under ``@idempotent``: the protocol's own
  cost, without the async path's ``async_to_sync`` hop.

``time.process_time()`` counts the CPU of every thread of the process (the client,
the event loop, the ``sync_to_async`` thread, the lease keeper); the database server's
CPU is not counted. Rounds alternate the cases and the medians are reported. A scratch
PostgreSQL database ``idem_bench_async_<pid>`` is created and dropped at the end.

    .venv/bin/python benchmarks/async_views.py [--rounds 5] [--requests 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.databases import pg_admin, with_database  # noqa: E402

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def configure(url: str) -> None:
    import django
    from django.conf import settings

    from example_project.settings import database_from_url

    database = database_from_url(url)
    database["CONN_MAX_AGE"] = None
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench",
        ALLOWED_HOSTS=["*"],
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_idempotency",
            "tests.testapp",
        ],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],
        IDEMPOTENCY={"STRATEGY": "db"},
    )
    django.setup()


urlpatterns: list[Any] = []


def routes() -> None:
    from django.http import HttpRequest, JsonResponse
    from django.urls import path

    from django_idempotency.decorators import idempotency_opt_in, idempotent
    from tests.testapp.models import SideEffect

    async def bare(request: HttpRequest) -> JsonResponse:
        row = await SideEffect.objects.acreate(label="bench")
        return JsonResponse({"id": row.pk}, status=201)

    async def marked(request: HttpRequest) -> JsonResponse:
        return await bare(request)

    def sync_bare(request: HttpRequest) -> JsonResponse:
        row = SideEffect.objects.create(label="bench")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    name = f"idem_bench_async_{os.getpid()}"
    pg_admin(f'CREATE DATABASE "{name}"', ADMIN_URL)
    try:
        configure(with_database(ADMIN_URL, name))
        routes()
        run(args.rounds, args.requests)
    finally:
        from django.db import connections

        connections.close_all()
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', ADMIN_URL)


def run(rounds: int, requests: int) -> None:
    from asgiref.sync import async_to_sync
    from django.core.management import call_command
    from django.test import AsyncClient, override_settings

    call_command("migrate", verbosity=0)
    plain = AsyncClient()
    with override_settings(MIDDLEWARE=["django_idempotency.middleware.IdempotencyMiddleware"]):
        with_middleware = AsyncClient()

        cases: dict[str, tuple[AsyncClient, str, bool]] = {
            "bare": (plain, "/bare/", False),
            "@idempotent, no key": (plain, "/decorated/", False),
            "@idempotent, new key": (plain, "/decorated/", True),
            "middleware, new key": (with_middleware, "/marked/", True),
            "sync view, bare": (plain, "/sync-bare/", False),
            "sync view, new key": (plain, "/sync-decorated/", True),
        }
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        wall: dict[str, list[float]] = {name: [] for name in cases}

        async def once(client: AsyncClient, url: str, keyed: bool) -> tuple[float, float]:
            started_cpu, started = time.process_time(), time.perf_counter()
            for _ in range(requests):
                headers = {"Idempotency-Key": uuid.uuid4().hex} if keyed else {}
                response = await client.post(url, b"{}", "application/json", headers=headers)
                assert response.status_code == 201, response.content
            return time.process_time() - started_cpu, time.perf_counter() - started

        for _ in range(2):  # warm up: connections, the middleware chain
            for client, url, keyed in cases.values():
                async_to_sync(once)(client, url, keyed)
        for index in range(rounds):
            order = list(cases) if index % 2 == 0 else list(reversed(cases))
            for case in order:
                c, w = async_to_sync(once)(*cases[case])
                cpu[case].append(c / requests)
                wall[case].append(w / requests)
    base_cpu = statistics.median(cpu["bare"])
    print(f"{requests} requests x {rounds} rounds, medians per request (PostgreSQL, db strategy)")
    print(f"{'case':<24} {'CPU ms':>8} {'vs bare':>8} {'wall ms':>8}")
    for case in cases:
        c, w = statistics.median(cpu[case]), statistics.median(wall[case])
        print(f"{case:<24} {c * 1000:8.3f} {c / base_cpu:7.2f}x {w * 1000:8.3f}")


if __name__ == "__main__":
    main()
