"""The budget of a request: where the library's instructions and client CPU go, by part.

For one new key and one replay under each strategy, beside the plain view and the same work
written by hand on the raw drivers (``hand-db``: psycopg; ``hand-redis``: redis-py; see
benchmarks/control/orders/hand.py), on the control project (Django's test client, in
process, PostgreSQL and a private Redis):

* **instructions** (deterministic): one process under ``valgrind --tool=callgrind`` runs
  ``--callgrind-requests`` requests of each route. A C frame evaluator (``_parts.c``) runs
  every Python frame through a function named after its part, the part of its module
  (``parts.py``), and every other function is skipped, so that callgrind files each
  instruction under the innermost part; thousands of instructions per request, by part.
* **client CPU** (``time.process_time``): ``--rounds`` interleaved rounds of ``--requests``
  requests per route, each run bare (the route's µs per request, and plain µs ÷ route µs
  within the round: median (min-max) of the rounds) and then with a per-thread CPU clock read
  at each change of part (the µs of each part: medians; the clock's reads add a little).

The parts: Django/DRF/the view, the view's database calls, and the library's key and
headers, scope, fingerprint, options, lifecycle and state bookkeeping, SQL or script
building (the store), driver calls, response capture and storage, signals and metrics,
problem rendering, other library code; the hand-written routes' own code is one part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.control import STRATEGIES, control_run
from benchmarks.harness.paths import benchmark_command
from benchmarks.harness.report import conditions, emit

from . import callgrind
from .tables import instruction_tables, time_tables
from .worker import routes, worker


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--callgrind-requests", type=int, default=5, help="requests per route under callgrind")
    add("--no-instructions", action="store_true", help="leave callgrind out")
    add("--no-times", action="store_true", help="leave the CPU time rounds out")
    add("--no-hand", action="store_true", help="leave the hand-written routes out")
    add("--worker", choices=("callgrind", "times"), help=argparse.SUPPRESS)


def measured(args: argparse.Namespace, mode: str, *more: str) -> list[str]:
    return benchmark_command(
        "budget", "--worker", mode, "--strategies", ",".join(args.strategies),
        "--rounds", str(args.rounds), *more, *(["--no-hand"] if args.no_hand else []),
    )  # fmt: skip


def instructions(args: argparse.Namespace, env: dict[str, str]) -> dict[str, dict[int, int]]:
    """Instructions per request of each route, by part number (-1: no part's)."""
    requests = args.callgrind_requests
    with tempfile.TemporaryDirectory(prefix="idem-budget-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        command = measured(args, "callgrind", "--requests", str(requests))
        result = subprocess.run(
            [*callgrind.options(out), *command], env=env, check=False, capture_output=True,
            text=True,
        )  # fmt: skip
        if result.returncode != 0:
            raise SystemExit(f"callgrind: exit {result.returncode}\n{result.stderr[-3000:]}")
        counts = {}
        for path in Path(tmp).glob("callgrind.out*"):
            trigger, _total, parts = callgrind.read_dump(path)
            if trigger:
                counts[trigger] = {n: cost / requests for n, cost in parts.items()}
    return counts


def times(args: argparse.Namespace, env: dict[str, str]) -> dict[str, list[Any]]:
    command = measured(args, "times", "--requests", str(args.requests))
    result = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    samples: dict[str, list[Any]] = json.loads(result.stdout.strip().splitlines()[-1])["times"]
    return samples


def run(args: argparse.Namespace) -> int:
    if args.worker:
        return worker(args)
    if not args.no_instructions and shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (make valgrind), or --no-instructions")
    names = routes(args.strategies, hand=not args.no_hand)
    print(
        conditions(
            f"callgrind: {args.callgrind_requests} requests per route; CPU: {args.rounds} "
            f"rounds x {args.requests} requests per route"
        ),
        flush=True,
    )
    tables = []
    with control_run() as env:
        # Migrate (and make the token) once, outside the measured processes.
        migrate = benchmark_command("cpu", "--worker", "--only", "plain", "--requests", "0")
        subprocess.run(migrate, env=env, check=True)
        if not args.no_instructions:
            tables += instruction_tables(names, instructions(args, env))
        if not args.no_times:
            tables += time_tables(names, times(args, env))
    emit(tables, args.json)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=9,
    requests=100,
    strategies=STRATEGIES,
    quick={"rounds": 2, "requests": 10, "callgrind_requests": 2},
)
