"""The process the budget measures: the control project's routes through Django's test
client, every Python frame filed under its part (``parts.py``).

``--worker callgrind``: under callgrind, each route's requests with collection on, then a
dump named after the route. ``--worker times``: interleaved rounds; in each, every route
runs its requests twice, bare (the route's CPU) and with the part clock on (its split).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.harness.control import BODY, TOKEN, quiet_loss_marker
from benchmarks.harness.rounds import interleave

HAND = ("hand-db", "hand-redis")
#: Requests of each route before it is measured; under callgrind, where each costs about a
#: second of CPU, fewer (the first one imports, opens the connections and writes the replay
#: key; the counts are the same from the third on).
WARM_UP, WARM_UP_UNDER_CALLGRIND = 20, 3


def routes(strategies: list[str], hand: bool = True) -> list[str]:
    """``plain``, then each strategy's (and the hand-written) new key and replay."""
    sources = [*strategies, *(HAND if hand else ())]
    return ["plain", *sources, *(f"{s}-replay" for s in sources)]


def caller() -> Callable[[str], None]:
    """``call(route)``: one POST of the route (a fresh key, or the route's replay key)."""
    from django.test import Client

    client = Client()
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def call(route: str) -> None:
        source, replay = route.removesuffix("-replay"), route.endswith("-replay")
        headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Token {TOKEN}"}
        if source != "plain":
            key = f"{run}-{source}-replay" if replay else f"{run}-{next(counter)}"
            headers["HTTP_IDEMPOTENCY_KEY"] = key
        response = client.post(
            f"/{source}/orders/", BODY, content_type="application/json", **headers
        )
        if response.status_code != 201:
            raise SystemExit(f"{route}: HTTP {response.status_code} {response.content[:300]!r}")

    return call


def prepare(names: list[str], warm_up: int) -> tuple[Any, Callable[[str], None]]:
    """Django set up, the parts' evaluator installed, every route warmed up through it (the
    connections, the caches, the replay keys, each code object's part). The database was
    migrated by the measure, before (migrating again under callgrind would take minutes)."""
    import django

    from .parts import install

    django.setup()
    from benchmarks.control.orders.hand import create_table

    create_table()
    if "hybrid" in names:
        quiet_loss_marker()
        hold_suspect_reads()
    native = install()
    call = caller()
    for name in names:
        for _ in range(warm_up):
            native.run(lambda name=name: call(name))
    return native, call


def hold_suspect_reads() -> None:
    """The hybrid strategy reads the suspect rows once a second per process (one ``SELECT``
    of an empty table, docs/hybrid.md "Fallback episodes"): in service, the hundreds of
    requests of a second share it; under callgrind, where a request costs about a second,
    each would pay it. The budget counts a request's own work: the read is held off."""
    from django_idempotency.strategies.redis.suspects import suspects

    suspects.next_read = math.inf


def callgrind(args: argparse.Namespace, names: list[str]) -> None:
    native, call = prepare(names, WARM_UP_UNDER_CALLGRIND)
    for name in names:
        gc.collect()
        native.collect()
        for _ in range(args.requests):
            native.run(lambda name=name: call(name))
        native.collect()
        native.dump(name)


def times(args: argparse.Namespace, names: list[str]) -> None:
    """One JSON line per route and round: its bare CPU (µs per request) and the CPU of each
    part (µs per request, with the part clock on)."""
    native, call = prepare(names, WARM_UP)

    def run(name: str, _round: int) -> tuple[float, list[float]]:
        gc.collect()
        started = time.process_time()
        for _ in range(args.requests):
            call(name)
        bare = (time.process_time() - started) / args.requests * 1e6
        gc.collect()
        native.times()
        native.changed()
        for _ in range(args.requests):
            native.run(lambda: call(name), True)
        split = [ns / 1e3 / args.requests for ns in native.times()]
        return bare, [*split, native.changed() / args.requests]

    samples = interleave(names, args.rounds, run, "rotate")
    print(json.dumps({"times": samples}), flush=True)


def worker(args: argparse.Namespace) -> int:
    names = routes(args.strategies, hand=not args.no_hand)
    if args.worker == "callgrind":
        callgrind(args, names)
    else:
        times(args, names)
    return 0
