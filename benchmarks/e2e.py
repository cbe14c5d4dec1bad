"""End-to-end throughput of the example API with and without the mixin.

The example payments API runs under gunicorn against a scratch PostgreSQL
database (migrated and seeded), once per strategy, with the same server
settings for every run. ``wrk`` drives it with a Lua script that sends a fresh
``Idempotency-Key`` with every request:

* ``POST /api/charges/``       the view with ``IdempotencyMixin`` (key required);
* ``POST /baseline/charges/``  the same view without the mixin
  (``EXAMPLE_BASELINE_ROUTES=1``), sent the same headers and body.

The two are interleaved (the order flips every round) and the medians of
requests per second and of the p50/p99 latencies are reported with the ratio.
A replay run (one key for every request: one charge, then replays) is added
for the record. ``--statements`` prints the SQL each route sends for one
request (in-process, through Django's test client).

    .venv/bin/python benchmarks/e2e.py [--strategies db,advisory_lock]
        [--rounds 5] [--duration 10] [--connections 8] [--workers 2] [--threads 4]
        [--statements] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.example import example_env, example_server, scratch_database  # noqa: E402

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TOKEN = "alice-token"
BODY = '{"amount": 1000, "currency": "EUR"}'

WRK_SCRIPT = r"""
-- A fresh Idempotency-Key per request (mode "fresh"), or one key for all ("replay").
local threads = {}
local count = 0

function setup(thread)
  count = count + 1
  thread:set("tid", count)
  table.insert(threads, thread)
end

function init(args)
  run = args[1]
  mode = args[2]
  body = args[3]
  sent = 0
  created = 0
  replayed = 0
  other = 0
  other_status = 0
end

function request()
  sent = sent + 1
  local key
  if mode == "replay" then
    key = run .. "-replay"
  else
    key = run .. "-" .. tid .. "-" .. sent
  end
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Token __TOKEN__",
    ["Idempotency-Key"] = key,
  }, body)
end

function response(status, headers, body)
  if status == 201 then
    if headers["Idempotent-Replayed"] then
      replayed = replayed + 1
    else
      created = created + 1
    end
  else
    other = other + 1
    other_status = status
  end
end

function done(summary, latency, requests)
  local created, replayed, other, other_status = 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    created = created + thread:get("created")
    replayed = replayed + thread:get("replayed")
    other = other + thread:get("other")
    if thread:get("other_status") ~= 0 then other_status = thread:get("other_status") end
  end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "created": %d, "replayed": %d, '
    .. '"other": %d, "other_status": %d, "socket_errors": %d, "p50_us": %d, '
    .. '"p90_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, created, replayed, other, other_status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
""".replace("__TOKEN__", TOKEN)


# -- set-up ---------------------------------------------------------------------------------


def bench_env(strategy: str, **extra: str) -> dict[str, str]:
    """What the example project is given on top of ``example_env`` for ``strategy``."""
    env = {"IDEMPOTENCY_STRATEGY": strategy, **extra}
    if strategy in REDIS_STRATEGIES:
        env.update(
            REDIS_URL=BENCH_REDIS_URL,
            IDEMPOTENCY_REDIS_PREFIX=BENCH_REDIS_PREFIX,
            CELERY_BROKER_URL=BENCH_REDIS_URL,
        )
    return env


#: Strategies that need Redis; the benchmark points them at BENCH_REDIS_URL (default DB 14 of
#: the local server) under a prefix of its own, and removes its keys afterwards.
REDIS_STRATEGIES = frozenset({"redis", "hybrid"})
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
BENCH_REDIS_PREFIX = f"idem-bench-{os.getpid()}"


def clean_redis() -> None:
    """Remove this run's keys and the drain tasks it queued (no worker runs here)."""
    import redis

    client = redis.Redis.from_url(BENCH_REDIS_URL)
    for key in client.scan_iter(match=f"{BENCH_REDIS_PREFIX}:*", count=1000):
        client.delete(key)
    client.delete("celery")
    for key in client.scan_iter(match="_kombu.binding*", count=1000):
        client.delete(key)


@contextmanager
def server(database_url: str, strategy: str, workers: int, threads: int) -> Iterator[str]:
    """gunicorn with gthread workers; the same settings for every strategy and route."""
    with example_server(
        database_url,
        strategy=strategy,
        workers=workers,
        threads=threads,
        env=bench_env(strategy),
        ready_timeout=60,
    ) as running:
        yield running.url


# -- wrk ------------------------------------------------------------------------------------


def wrk_binary() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk, or make bench)")
    return path


def wrk(url: str, script: str, mode: str, duration: float, connections: int) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    out = subprocess.run(
        [
            wrk_binary(),
            "-t1",
            f"-c{connections}",
            f"-d{int(duration)}s",
            "--timeout",
            "10s",
            "-s",
            script,
            url,
            "--",
            run_id,
            mode,
            BODY,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration + 60,
    ).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk printed no summary:\n" + out)
    result: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def describe(result: dict[str, Any]) -> str:
    extra = f", {result['replayed']} replayed" if result["replayed"] else ""
    if result["other"]:
        extra += f", {result['other']} other (last status {result['other_status']})"
    if result["socket_errors"]:
        extra += f", {result['socket_errors']} socket errors"
    return (
        f"{result['rps']:7.1f} req/s  p50 {result['p50_us'] / 1000:6.2f} ms  "
        f"p99 {result['p99_us'] / 1000:6.2f} ms  ({result['created']} created{extra})"
    )


def bench_strategy(
    database_url: str, strategy: str, args: argparse.Namespace, script: str
) -> dict[str, Any]:
    routes = {"baseline": "/baseline/charges/", "mixin": "/api/charges/"}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in routes}
    with server(database_url, strategy, args.workers, args.threads) as url:
        for path in routes.values():  # warm up both routes and all connections
            wrk(url + path, script, "fresh", 2, args.connections)
        for r in range(args.rounds):
            order = list(routes) if r % 2 == 0 else list(reversed(routes))
            for name in order:
                result = wrk(url + routes[name], script, "fresh", args.duration, args.connections)
                runs[name].append(result)
                print(f"  round {r + 1}/{args.rounds} {name:<8} {describe(result)}", flush=True)
        replay = wrk(url + routes["mixin"], script, "replay", args.duration, args.connections)
        print(f"  replay (one key)   {describe(replay)}", flush=True)

    def med(name: str, field: str) -> float:
        return float(statistics.median(r[field] for r in runs[name]))

    summary = {
        "strategy": strategy,
        "baseline_rps": med("baseline", "rps"),
        "mixin_rps": med("mixin", "rps"),
        "baseline_p50_ms": med("baseline", "p50_us") / 1000,
        "baseline_p99_ms": med("baseline", "p99_us") / 1000,
        "mixin_p50_ms": med("mixin", "p50_us") / 1000,
        "mixin_p99_ms": med("mixin", "p99_us") / 1000,
        "replay_rps": replay["rps"],
        "replay_p50_ms": replay["p50_us"] / 1000,
        "replay_p99_ms": replay["p99_us"] / 1000,
        "ratio_of_medians": med("mixin", "rps") / med("baseline", "rps"),
        "ratio_median_of_pairs": statistics.median(
            m["rps"] / b["rps"] for m, b in zip(runs["mixin"], runs["baseline"], strict=True)
        ),
        "runs": runs,
        "replay": replay,
    }
    failed = sum(r["other"] + r["socket_errors"] for rs in runs.values() for r in rs)
    if failed:
        print(f"  WARNING: {failed} requests did not answer 201 in the fresh-key runs")
    summary["failed"] = failed
    return summary


# -- statements per request -----------------------------------------------------------------

STATEMENTS_SCRIPT = r"""
import json, uuid
import django
django.setup()
from django.db import connection
from django.test import Client

client = Client()
for name, path in (("baseline", "/baseline/charges/"), ("mixin", "/api/charges/")):
    for attempt in ("fresh", "replay"):
        if name == "baseline" and attempt == "replay":
            continue
        key = f"stmt-{name}" if attempt == "replay" else uuid.uuid4().hex
        if attempt == "replay":
            client.post(path, data=BODY, content_type="application/json",
                        HTTP_AUTHORIZATION="Token TOKEN", HTTP_IDEMPOTENCY_KEY=key)
        seen = []
        commits = []
        def wrapper(execute, sql, params, many, context):
            seen.append(sql)
            return execute(sql, params, many, context)
        real_commit = connection.commit
        def commit():
            commits.append(len(seen))
            return real_commit()
        connection.commit = commit
        with connection.execute_wrapper(wrapper):
            response = client.post(path, data=BODY, content_type="application/json",
                                   HTTP_AUTHORIZATION="Token TOKEN", HTTP_IDEMPOTENCY_KEY=key)
        del connection.commit
        print(f"{name} ({attempt} key): HTTP {response.status_code}, {len(seen)} statements,"
              f" {len(commits)} explicit COMMIT (other writes commit on their own)")
        for sql in seen:
            print("   ", sql[:150])
""".replace("BODY", repr(BODY)).replace("TOKEN", TOKEN)


def print_statements(database_url: str, strategy: str) -> None:
    print(f"\nSQL per request, strategy {strategy}:")
    subprocess.run(
        [sys.executable, "-c", STATEMENTS_SCRIPT],
        env=example_env(database_url, bench_env(strategy, DJANGO_ALLOWED_HOSTS="*")),
        cwd=ROOT,
        check=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--strategies", default="db,advisory_lock", help="comma-separated; also redis, hybrid"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--statements", action="store_true", help="print SQL per request too")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    wrk_binary()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; gunicorn --workers {args.workers} "
        f"--worker-class gthread --threads {args.threads}; wrk -t1 -c{args.connections} "
        f"-d{args.duration:g}s, {args.rounds} rounds"
    )
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp,
        scratch_database("postgres", admin_url=ADMIN_URL, prefix="idem_bench_") as db_url,
    ):
        script = os.path.join(tmp, "fresh_key.lua")
        Path(script).write_text(WRK_SCRIPT)
        for strategy in args.strategies.split(","):
            if args.statements:
                print_statements(db_url, strategy)
            print(f"\nstrategy {strategy}", flush=True)
            try:
                results.append(bench_strategy(db_url, strategy, args, script))
            finally:
                if strategy in REDIS_STRATEGIES:
                    clean_redis()
    print()
    print(
        f"{'strategy':<14} {'route':<9} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6}"
        "  (median of the per-round ratios; in brackets the ratio of the medians)"
    )
    for s in results:
        print(
            f"{s['strategy']:<14} {'baseline':<9} {s['baseline_rps']:8.1f} "
            f"{s['baseline_p50_ms']:7.2f} {s['baseline_p99_ms']:7.2f} {1:6.2f}"
        )
        print(
            f"{'':<14} {'mixin':<9} {s['mixin_rps']:8.1f} {s['mixin_p50_ms']:7.2f} "
            f"{s['mixin_p99_ms']:7.2f} {s['ratio_median_of_pairs']:6.2f} "
            f"({s['ratio_of_medians']:.2f})"
        )
        print(
            f"{'':<14} {'replay':<9} {s['replay_rps']:8.1f} {s['replay_p50_ms']:7.2f} "
            f"{s['replay_p99_ms']:7.2f} {s['replay_rps'] / s['baseline_rps']:6.2f}"
        )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if any(s["failed"] for s in results) else 0


if __name__ == "__main__":
    sys.exit(main())
