"""The process that calls the control project's routes: Django's test client, in-process.

It runs with the control project's environment (``control_run()``), started by the cpu
measure as ``python -m benchmarks cpu --worker ...``: the rounds of every route, one route
under cProfile (``--profile``) or alone (``--only``, for callgrind, py-spy or ``--wrap``), or
the statements each route sends (``--statements``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.harness.control import BODY, TOKEN, quiet_loss_marker, setup_django
from benchmarks.harness.report import Column, Table, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread

from .statements import print_statements


def routes(strategies: list[str], replay: bool) -> list[str]:
    names = ["plain", *(["floor", "floorcommit"] if "db" in strategies else []), *strategies]
    if replay:
        names += [f"{s}-replay" for s in strategies]
    return names


def caller() -> Callable[[str], None]:
    """``call(route)``: one POST of the route (a fresh key, or the route's replay key)."""
    from django.test import Client

    client = Client()
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Token {TOKEN}"}
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def call(route: str) -> None:
        strategy, _, mode = route.partition("-")
        path = f"/{strategy}/orders/"
        if strategy in ("plain", "floor", "floorcommit"):
            response = client.post(path, BODY, content_type="application/json", **headers)
        else:
            key = f"{run}-{strategy}-replay" if mode else f"{run}-{next(counter)}"
            response = client.post(
                path, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **headers
            )
        if response.status_code != 201:
            raise SystemExit(f"{route}: HTTP {response.status_code} {response.content[:300]!r}")

    return call


def worker(args: argparse.Namespace) -> int:
    setup_django()
    if not args.first_day and "hybrid" in args.strategies:
        quiet_loss_marker()
    call = caller()
    one = args.profile or args.only
    names = [one] if one else routes(args.strategies, not args.no_replay)
    for name in names:  # warm up: connections, caches, the replay keys
        for _ in range(20):
            call(name)
    if args.statements:
        print_statements(names, call)
    elif args.profile:
        profile(args, call)
    elif args.only:
        for _ in range(args.requests):
            call(args.only)
    else:
        emit([rounds(args, names, call)], args.json)
    return 0


def profile(args: argparse.Namespace, call: Callable[[str], None]) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(args.requests):
        call(args.profile)
    profiler.disable()
    if args.dump:
        profiler.dump_stats(args.dump)
    stats = pstats.Stats(profiler).sort_stats(args.sort)
    stats.print_stats(*([args.filter] if args.filter else []), args.lines)


def rounds(args: argparse.Namespace, names: list[str], call: Callable[[str], None]) -> Table:
    """CPU per request of each route, the routes' order rotating every round; the ratio is
    plain CPU over the route's CPU within each round."""

    def run(name: str, _round: int) -> tuple[float, float]:
        gc.collect()
        started, kernel = time.process_time(), os.times().system
        for _ in range(args.requests):
            call(name)
        cpu = (time.process_time() - started) / args.requests * 1000
        return cpu, (os.times().system - kernel) / args.requests * 1000

    samples = interleave(names, args.rounds, run, "rotate")
    plain = [cpu for cpu, _kernel in samples["plain"]]
    table = Table(
        "Client CPU per request (ratio = plain CPU / route CPU, median (min-max) of the rounds)",
        [Column("route"), Column("CPU ms/request", ".3f"), Column("of it kernel", ".3f"),
         Column("ratio to plain", ".2f"), Column("adds µs", ".0f")],
    )  # fmt: skip
    for name in names:
        cpu = [c for c, _kernel in samples[name]]
        added = [(c - p) * 1000 for p, c in zip(plain, cpu, strict=True)]
        table.add(
            name,
            spread(cpu).median,
            spread([k for _c, k in samples[name]]).median,
            ratio(plain, cpu),
            None if name == "plain" else spread(added).median,
        )
    return table
