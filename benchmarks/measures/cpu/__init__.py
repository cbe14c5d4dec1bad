"""Client CPU per request: the control DRF view with and without the mixin, in-process.

Each route of the control project (benchmarks/control) is called through Django's test
client in one process; time.process_time() over --requests requests gives the CPU each costs
there: Django, DRF, the library, psycopg and redis-py, not PostgreSQL's or Redis's own work
(the kernel's share, from os.times(), is printed beside it). The routes are interleaved (the
order rotates every round) and each round's ratio is taken against the plain view of that
round: plain CPU / route CPU, so above 1 is cheaper than the plain view.

* plain: ListCreateAPIView + ModelSerializer, token auth, one INSERT;
* floor (with db): the plain view plus the round trips of a db new key, no library code
  (RoundTripFloor); floorcommit, the same with Django's COMMIT on its own (one round trip
  more): what the completion carrying the COMMIT saves;
* <strategy>: the same view with IdempotencyMixin, a fresh key per request;
* <strategy>-replay: the same view, one key already completed (a replay).

Other modes: --instructions (callgrind: instructions per request, which the load does not
change), --breakdown ROUTE (py-spy: where one route's CPU goes), --statements (the SQL and
Redis commands of one request of each route), --profile ROUTE (cProfile), --only ROUTE
(one route alone, e.g. under --wrap "py-spy record -o x --").
"""

from __future__ import annotations

import argparse
import shlex
import subprocess

from benchmarks.harness.cli import Measure
from benchmarks.harness.control import STRATEGIES, control_run
from benchmarks.harness.paths import benchmark_command
from benchmarks.harness.report import conditions

from .breakdown import breakdown
from .instructions import instructions
from .worker import worker


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--no-replay", action="store_true", help="leave the replay routes out")
    add(
        "--first-day",
        action="store_true",
        help="hybrid without a loss marker (every new key looked up, as for a TTL after a "
        "deployment or a Redis loss)",
    )
    add("--statements", action="store_true", help="print the SQL and Redis commands per request")
    add(
        "--instructions",
        action="store_true",
        help="count instructions per request under callgrind instead",
    )
    add(
        "--breakdown",
        default="",
        metavar="ROUTE",
        help="py-spy one route: the share of each part of a request",
    )
    add("--profile", default="", metavar="ROUTE", help="cProfile one route instead")
    add("--sort", default="cumulative", help="--profile: the pstats order")
    add("--dump", default="", help="--profile: also write the pstats file")
    add("--lines", type=int, default=60, help="--profile: lines printed")
    add("--filter", default="", help="--profile: only functions whose path matches")
    add("--only", default="", metavar="ROUTE", help="run one route only (for --wrap)")
    add("--wrap", default="", help='a command the worker runs under, e.g. "py-spy record -o x --"')
    add("--worker", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.worker:
        return worker(args)
    print(
        conditions(f"{args.rounds} rounds x {args.requests} requests per route"),
        flush=True,
    )
    if args.instructions:
        return instructions(args)
    if args.breakdown:
        return breakdown(args)
    command = benchmark_command("cpu", "--worker", *args.argv)
    if args.wrap:
        command = [*shlex.split(args.wrap), *command]
    with control_run() as env:
        return subprocess.run(command, env=env, check=False).returncode


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=15,
    requests=150,
    strategies=STRATEGIES,
    quick={"rounds": 3, "requests": 30},
)
