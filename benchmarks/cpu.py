"""Client CPU per request: the control DRF view with and without the mixin, in-process.

Each route of the control project (benchmarks/control) is called through Django's
test client in this process; ``time.process_time()`` over ``--requests`` requests
gives the CPU each costs here: Django, DRF, the library, psycopg and redis-py, not
PostgreSQL's or Redis's own work. The routes are interleaved (the order rotates
every round) and each round's ratio is taken against the plain view of that round.

* ``plain``: ``ListCreateAPIView`` + ``ModelSerializer``, token auth, one ``INSERT``;
* ``floor`` (with ``db``): the plain view plus the round trips of a ``db`` new key, no
  library code (``RoundTripFloor``): the part of ``db``'s cost that is the round trips;
  ``floorcommit``, the same with Django's COMMIT on its own (one round trip more): what
  the completion carrying the COMMIT saves;
* ``<strategy>``: the same view with ``IdempotencyMixin``, a fresh key per request;
* ``<strategy>-replay``: the same view, one key already completed (a replay).

    .venv/bin/python benchmarks/cpu.py [--strategies db,advisory_lock,redis,hybrid]
        [--rounds 15] [--requests 150] [--profile ROUTE] [--breakdown ROUTE] [--instructions]
        [--only ROUTE --wrap COMMAND] [--statements]
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from control.bench import (  # noqa: E402
    BODY,
    STRATEGIES,
    TOKEN,
    clean_redis,
    control_database,
    control_env,
    quiet_loss_marker,
    setup_django,
)


def routes(strategies: list[str], replay: bool) -> list[str]:
    names = ["plain", *(["floor", "floorcommit"] if "db" in strategies else []), *strategies]
    if replay:
        names += [f"{s}-replay" for s in strategies]
    return names


def worker(args: argparse.Namespace) -> int:
    """Runs in a child process with the control project's environment."""
    setup_django()
    if not args.first_day and "hybrid" in args.strategies:
        quiet_loss_marker()
    from django.test import Client

    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Token {TOKEN}"}
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

    names = routes(args.strategies, not args.no_replay)
    if args.profile or args.only:
        names = [args.profile or args.only]
    for name in names:  # warm up: connections, caches, the replay keys
        for _ in range(20):
            call(name)

    if args.statements:
        print_statements(names, call)
        return 0

    if args.profile or args.only:
        route = args.profile or args.only
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for _ in range(args.requests):
                call(route)
            profiler.disable()
            if args.dump:
                profiler.dump_stats(args.dump)
            stats = pstats.Stats(profiler).sort_stats(args.sort)
            stats.print_stats(*([args.filter] if args.filter else []), args.lines)
        else:
            for _ in range(args.requests):
                call(route)
        return 0

    samples: dict[str, list[float]] = {name: [] for name in names}
    system: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gc.collect()
            started, kernel = time.process_time(), os.times().system
            for _ in range(args.requests):
                call(name)
            samples[name].append((time.process_time() - started) / args.requests * 1000)
            system[name].append((os.times().system - kernel) / args.requests * 1000)
    print(
        f"{'route':<22} {'CPU ms/request':>15} {'of it kernel':>13} {'ratio to plain':>15}"
        "  min-max of the rounds"
    )
    plain = samples["plain"]
    for name in names:
        ratios = [p / s for p, s in zip(plain, samples[name], strict=True)]
        added = [s - p for p, s in zip(plain, samples[name], strict=True)]
        print(
            f"{name:<22} {statistics.median(samples[name]):15.3f} "
            f"{statistics.median(system[name]):13.3f} "
            f"{statistics.median(ratios):15.2f}  {min(ratios):.2f}-{max(ratios):.2f}"
            + (f"   adds {statistics.median(added) * 1000:5.0f} µs" if name != "plain" else "")
        )
    return 0


def print_statements(names: list[str], call: Callable[[str], None]) -> None:
    """The SQL statements and Redis commands one request of each route sends."""
    from django.db import connection
    from redis.connection import Connection

    sent: list[str] = []
    real_send = Connection.send_packed_command
    real_pack = Connection.pack_commands

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        sent.append(" ".join(sql.split())[:110])
        return execute(sql, params, many, context)

    def pack_commands(self, commands):  # type: ignore[no-untyped-def]
        sent.append("redis pipeline: " + " ".join(str(c[0]) for c in commands))
        return real_pack(self, commands)

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        if isinstance(command, bytes) or (isinstance(command, list) and len(command) == 1):
            head = command if isinstance(command, bytes) else command[0]
            sent.append("redis: " + bytes(head)[:60].decode(errors="replace").split("\r\n")[2])
        return real_send(self, command, check_health)

    Connection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    Connection.pack_commands = pack_commands  # type: ignore[method-assign]
    try:
        for name in names:
            sent.clear()
            with connection.execute_wrapper(wrapper):
                call(name)
            print(f"{name}: {len(sent)} statements and commands")
            for line in sent:
                print("   ", line)
    finally:
        Connection.send_packed_command = real_send  # type: ignore[method-assign]
        Connection.pack_commands = real_pack  # type: ignore[method-assign]


def callgrind_total(command: list[str], env: dict[str, str]) -> int:
    """Instructions (Ir) that ``command`` executes under ``valgrind --tool=callgrind``."""
    with tempfile.TemporaryDirectory(prefix="idem-callgrind-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for line in Path(out).read_text().splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no totals")


def instructions(args: argparse.Namespace, prefix: str) -> int:
    """Instructions per request of each route: (run with N requests - run with 0) / N,
    each route in a process of its own under callgrind. User-space instructions only:
    the kernel's work for each round trip (send, poll, receive) is not in it."""
    names = routes(args.strategies, not args.no_replay)
    per_request: dict[str, float] = {}
    with control_database() as url:
        try:
            env = control_env(url, prefix)
            # Migrate once outside the measured processes.
            subprocess.run(
                [sys.executable, __file__, "--worker", "--only", "plain", "--requests", "0"],
                env=env,
                check=True,
            )
            for name in names:
                base = [sys.executable, __file__, "--worker", "--only", name]
                empty = callgrind_total([*base, "--requests", "0"], env)
                full = callgrind_total([*base, "--requests", str(args.requests)], env)
                per_request[name] = (full - empty) / args.requests
                ratio = per_request["plain"] / per_request[name]
                print(
                    f"{name:<22} {per_request[name] / 1e6:8.3f} M instructions/request  "
                    f"ratio to plain {ratio:5.2f}",
                    flush=True,
                )
        finally:
            clean_redis(prefix)
    return 0


#: Where a request's CPU goes: (label, frame names, or "(path/" for a file's frames); a
#: sample counts for the label of its innermost frame that has one, so that the library's
#: own work is split from the database round trips it sends. ``capture`` renders the DRF
#: response, which Django renders later without the mixin (in "the rest").
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "claim statement / Redis script",
        (
            "KeyStatements.claim",
            "RedisStore.claim",
            "RedisStore.claim_checking_loss",
            "AdvisoryLockStrategy.claim",
        ),
    ),
    # The store, and on PostgreSQL the COMMIT it carries with Django's block ended after it.
    ("completion statement / script (+ COMMIT)", ("TransactionalClaim.complete",)),
    ("Django's COMMIT, after-commit", ("Session.__exit__",)),
    ("BEGIN, on_commit, settle", ("Session._settle_and_begin",)),
    ("header, scope, fingerprint", ("IdempotentRequest.from_request", "preload_body")),
    ("response capture", ("capture",)),
    (
        "events, lease",
        ("IdempotentRequest._keep", "IdempotentRequest._event", "IdempotentRequest._send"),
    ),
    ("the view's handler (serializer, INSERT)", ("CreateModelMixin.create",)),
    ("DRF: authentication, permissions", ("APIView.initial",)),
    ("DRF: request, response, exceptions", ("APIView.dispatch",)),
)


def _part_of(frames: list[str]) -> str | None:
    """The label of the innermost frame that has one; else "other library code" when a
    frame is the library's."""
    for frame in reversed(frames):
        name = frame.split(" (", 1)[0]
        for label, names in PARTS:
            if any(name.endswith(n) for n in names):
                return label
    if any("(django_idempotency/" in frame for frame in frames):
        return "other library code"
    return None


def breakdown(args: argparse.Namespace, prefix: str) -> int:
    """Sample the worker running one route with py-spy and print the share of each part of
    the request (on-CPU samples only; py-spy leaves idle threads out)."""
    route = args.breakdown
    with control_database() as url, tempfile.TemporaryDirectory(prefix="idem-spy-") as tmp:
        raw = os.path.join(tmp, "samples.txt")
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        env = control_env(url, prefix)
        command = [
            spy, "record", "--rate", "500", "--format", "raw", "--output", raw, "--",
            sys.executable, __file__, "--worker", "--only", route,
            "--requests", str(args.requests),
        ]  # fmt: skip
        try:
            subprocess.run(command, env=env, check=True, capture_output=True)
        finally:
            clean_redis(prefix)
        shares: dict[str, int] = {label: 0 for label, _ in PARTS}
        shares["other library code"] = 0
        total = 0
        for line in Path(raw).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            if not any(frame.split(" (", 1)[0].endswith(".call") for frame in frames):
                continue  # set-up, not a request
            total += int(count)
            label = _part_of(frames)
            if label is not None:
                shares[label] += int(count)
        print(f"{route}: {total} samples in requests")
        for label, count in shares.items():
            print(f"  {label:<42} {count / max(total, 1) * 100:5.1f} %")
        rest = total - sum(shares.values())
        label = "the rest (Django, middleware, test client)"
        print(f"  {label:<42} {rest / max(total, 1) * 100:5.1f} %")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument(
        "--first-day",
        action="store_true",
        help="hybrid without a loss marker (every new key looked up, as for a TTL after "
        "a deployment or a Redis loss)",
    )
    parser.add_argument(
        "--statements", action="store_true", help="print the SQL and Redis commands per request"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per request under callgrind instead (load-independent)",
    )
    parser.add_argument(
        "--breakdown", default="", help="py-spy one route: the share of each part of a request"
    )
    parser.add_argument("--profile", default="", help="cProfile one route instead")
    parser.add_argument("--sort", default="cumulative")
    parser.add_argument("--dump", default="", help="--profile: also write the pstats file")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--filter", default="", help="only functions whose path matches")
    parser.add_argument("--only", default="", help="run one route only (for --wrap)")
    parser.add_argument(
        "--wrap", default="", help='a command the worker runs under, e.g. "py-spy record -o x --"'
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.strategies = [s for s in args.strategies.split(",") if s]
    if args.worker:
        return worker(args)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.rounds} rounds x "
        f"{args.requests} requests per route, ratio = plain CPU / route CPU",
        flush=True,
    )
    prefix = f"idem-bench-{os.getpid()}"
    if args.instructions:
        return instructions(args, prefix)
    if args.breakdown:
        return breakdown(args, prefix)
    with control_database() as url:
        try:
            command = [sys.executable, __file__, "--worker", *sys.argv[1:]]
            if args.wrap:
                command = [*shlex.split(args.wrap), *command]
            return subprocess.run(command, env=control_env(url, prefix), check=False).returncode
        finally:
            clean_redis(prefix)
            print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
