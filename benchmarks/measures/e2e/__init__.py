"""Requests per second of the control DRF view with and without the mixin, under wrk.

The control project (benchmarks/control: startproject's middleware, token auth, a
ListCreateAPIView with a ModelSerializer that writes one row) runs under gunicorn against a
scratch PostgreSQL database and a private redis-server, one server for every route, so that
the server settings are the same for all of them:

* plain: /plain/orders/, the view without the mixin;
* <strategy>: /<strategy>/orders/, the same view with IdempotencyMixin and
  idempotency_strategy = <strategy>, a fresh key per request;
* <strategy>-replay: the same route, one key for every request of the run (one order, then
  replays).

wrk sends POST with a token, a JSON body and an Idempotency-Key (a Lua script). The routes
are interleaved: every round runs each route once, in an order that rotates from round to
round, after a 1 s warm-up of each; each round's ratio is the route's requests per second
over that round's plain run. Every response is checked (a fresh-key run must answer 201
only; a replay run one 201, then replays, and 409s while the first is in progress). Then
the cpu measure gives the in-process client CPU per request of the same routes (--no-cpu
skips it). The hybrid routes see a quiet Redis (a loss marker written two days ago, the
steady state); --first-day leaves it out. No Celery worker runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.control import STRATEGIES, TOKEN, control_run
from benchmarks.harness.paths import ROOT, benchmark_command
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread
from benchmarks.harness.web import gunicorn_command, serve

from .wrk import WRK_SCRIPT, describe, failed, wrk


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--duration",
        type=int,
        default=5,
        help="seconds of wrk per route and round (default: %(default)s)",
    )
    add("--connections", type=int, default=16, help="wrk's connections (default: %(default)s)")
    add("--workers", type=int, default=2, help="gunicorn workers (default: %(default)s)")
    add("--threads", type=int, default=4, help="threads per gunicorn worker (default: %(default)s)")
    add("--no-replay", action="store_true", help="leave the replay routes out")
    add("--no-cpu", action="store_true", help="skip the in-process CPU part")
    add("--first-day", action="store_true", help="hybrid without a loss marker")


def routes(strategies: list[str], replay: bool) -> dict[str, tuple[str, str]]:
    """Route name -> (path, wrk mode)."""
    found = {"plain": ("/plain/orders/", "plain")}
    for name in strategies:
        found[name] = (f"/{name}/orders/", "fresh")
    if replay:
        for name in strategies:
            found[f"{name}-replay"] = (f"/{name}/orders/", "replay")
    return found


def prepare(env: dict[str, str], args: argparse.Namespace) -> None:
    """Migrate, give the benchmark user its token, write the quiet loss marker."""
    setup = "from benchmarks.harness.control import quiet_loss_marker, setup_django; setup_django()"
    if "hybrid" in args.strategies and not args.first_day:
        setup += "; quiet_loss_marker()"
    subprocess.run([sys.executable, "-c", setup], env=env, cwd=ROOT, check=True)


def measure(
    args: argparse.Namespace, env: dict[str, str], script: str
) -> tuple[dict[str, list[Any]], int]:
    """Every route under wrk, round after round: wrk's summaries by route, and how many
    responses were not what the route must answer."""
    table = routes(args.strategies, not args.no_replay)
    command = gunicorn_command("benchmarks.control.wsgi", args.workers, args.threads)
    bad = 0
    with serve(command, env, ready_path="/plain/orders/", token=TOKEN) as server:
        for path, mode in table.values():  # warm up every route and connection
            wrk(server.url + path, script, mode, 1, args.connections)

        def run(name: str, r: int) -> dict[str, Any]:
            nonlocal bad
            path, mode = table[name]
            result = wrk(server.url + path, script, mode, args.duration, args.connections)
            bad += failed(mode, result)
            print(f"  round {r + 1} {name:<22} {describe(result)}", flush=True)
            return result

        runs = interleave(list(table), args.rounds, run, "rotate")
    return runs, bad


def report(runs: dict[str, list[Any]]) -> Table:
    table = Table(
        "Requests per second (ratio = route / plain within each round, median (min-max))",
        [Column("route"), Column("req/s", ".1f"), Column("p50 ms", ".2f"),
         Column("p99 ms", ".2f"), Column("ratio to plain", ".2f")],
    )  # fmt: skip
    plain = [r["rps"] for r in runs["plain"]]
    for name, results in runs.items():
        table.add(
            name,
            spread([r["rps"] for r in results]).median,
            spread([r["p50_us"] for r in results]).median / 1000,
            spread([r["p99_us"] for r in results]).median / 1000,
            ratio([r["rps"] for r in results], plain),
        )
    return table


def run(args: argparse.Namespace) -> int:
    print(conditions(
        f"gunicorn --workers {args.workers} --worker-class gthread --threads {args.threads}; "
        f"wrk -t1 -c{args.connections} -d{args.duration}s; {args.rounds} rounds"
    ), flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp, control_run() as env:
        script = os.path.join(tmp, "requests.lua")
        Path(script).write_text(WRK_SCRIPT)
        prepare(env, args)
        runs, bad = measure(args, env, script)
    if not args.no_cpu:
        print("\nIn-process client CPU per request (python -m benchmarks cpu):", flush=True)
        cpu = ["--strategies", ",".join(args.strategies)]
        cpu += ["--no-replay"] * args.no_replay + ["--first-day"] * args.first_day
        subprocess.run(benchmark_command("cpu", *cpu), check=True)
    emit([report(runs)], args.json)
    if bad:
        print(f"WARNING: {bad} responses were not what the route must answer")
    return 1 if bad else 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=5,
    strategies=STRATEGIES,
    quick={"rounds": 2, "duration": 1, "no_cpu": True},
)
