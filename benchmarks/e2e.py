"""Requests per second of an ordinary DRF view with and without the mixin, under wrk.

The control project (benchmarks/control: ``startproject`` middleware, token auth, a
``ListCreateAPIView`` with a ``ModelSerializer`` that writes one row) runs under
gunicorn against a scratch PostgreSQL database, one server for every route, so that
the server settings are the same for all of them:

* ``plain``              ``/plain/orders/``, the view without the mixin;
* ``<strategy>``         ``/<strategy>/orders/``, the same view with ``IdempotencyMixin``
                         and ``idempotency_strategy = <strategy>``, a fresh key per request;
* ``<strategy>-replay``  the same route, one key for every request of the run (one
                         order, then replays).

``wrk`` sends ``POST`` with a token, a JSON body and an ``Idempotency-Key`` (a Lua
script). The routes are interleaved: every round runs each route once, in an order
that rotates from round to round, and each round's ratio is taken against that round's
``plain`` run. The table gives the median requests per second, the p50/p99 latencies,
the median ratio and the spread (min-max) of the per-round ratios. Every response is
checked (a fresh-key run must answer 201 only). Then ``cpu.py`` gives the in-process
client CPU per request of the same routes (``--no-cpu`` skips it).

The hybrid routes see a quiet Redis (a loss marker written two days ago, the steady
state); ``--first-day`` leaves it out (every new key is looked up in the database).
No Celery worker runs: the outbox rows stay in the table and the queued drains in Redis
DB 14 (both removed afterwards).

    .venv/bin/python benchmarks/e2e.py [--strategies db,advisory_lock,redis,hybrid]
        [--rounds 5] [--duration 5] [--connections 16] [--workers 2] [--threads 4]
        [--no-replay] [--no-cpu] [--json results.json]
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

BENCHMARKS = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCHMARKS), str(BENCHMARKS.parent)]

from control.bench import (  # noqa: E402
    BODY,
    STRATEGIES,
    TOKEN,
    clean_redis,
    control_database,
    control_env,
)

from tests.support.example import gunicorn_command, serve  # noqa: E402

WRK_SCRIPT = r"""
-- A fresh Idempotency-Key per request (mode "fresh"), one key for all ("replay"), or
-- none ("plain").
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
  conflicts = 0
  other = 0
  other_status = 0
end

function request()
  sent = sent + 1
  local headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Token __TOKEN__",
  }
  if mode == "replay" then
    headers["Idempotency-Key"] = run .. "-replay"
  elseif mode == "fresh" then
    headers["Idempotency-Key"] = run .. "-" .. tid .. "-" .. sent
  end
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status == 201 then
    if headers["Idempotent-Replayed"] then
      replayed = replayed + 1
    else
      created = created + 1
    end
  elseif status == 409 then
    conflicts = conflicts + 1
  else
    other = other + 1
    other_status = status
  end
end

function done(summary, latency, requests)
  local created, replayed, conflicts, other, other_status = 0, 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    created = created + thread:get("created")
    conflicts = conflicts + thread:get("conflicts")
    replayed = replayed + thread:get("replayed")
    other = other + thread:get("other")
    if thread:get("other_status") ~= 0 then other_status = thread:get("other_status") end
  end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "created": %d, "replayed": %d, '
    .. '"conflicts": %d, "other": %d, "other_status": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, created, replayed, conflicts, other, other_status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
""".replace("__TOKEN__", TOKEN)


def routes(strategies: list[str], replay: bool) -> dict[str, tuple[str, str]]:
    """Route name -> (path, wrk mode)."""
    found = {"plain": ("/plain/orders/", "plain")}
    for name in strategies:
        found[name] = (f"/{name}/orders/", "fresh")
    if replay:
        for name in strategies:
            found[f"{name}-replay"] = (f"/{name}/orders/", "replay")
    return found


@contextmanager
def gunicorn(database_url: str, env: dict[str, str], workers: int, threads: int) -> Iterator[str]:
    """The control project under gunicorn (gthread workers) on a free port."""
    command = gunicorn_command("control.wsgi", workers, threads)
    with serve(
        "gunicorn", command, database_url, env, 60, ready_path="/plain/orders/", ready_token=TOKEN
    ) as server:
        yield server.url


def wrk(url: str, script: str, mode: str, duration: float, connections: int) -> dict[str, Any]:
    binary = shutil.which("wrk")
    if binary is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk, or make bench)")
    out = subprocess.run(
        [
            binary,
            "-t1",
            f"-c{connections}",
            f"-d{int(duration)}s",
            "--timeout",
            "10s",
            "-s",
            script,
            url,
            "--",
            uuid.uuid4().hex[:12],
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
    if result["conflicts"]:
        extra += f", {result['conflicts']} in progress (409)"
    if result["other"]:
        extra += f", {result['other']} other (last status {result['other_status']})"
    if result["socket_errors"]:
        extra += f", {result['socket_errors']} socket errors"
    return (
        f"{result['rps']:7.1f} req/s  p50 {result['p50_us'] / 1000:6.2f} ms  "
        f"p99 {result['p99_us'] / 1000:6.2f} ms  ({result['created']} created{extra})"
    )


def failed(name: str, mode: str, result: dict[str, Any]) -> int:
    """Requests that did not answer as the route must: 201, and in a replay run a 201
    replay after the first, or a 409 while the first is in progress."""
    bad = result["other"] + result["socket_errors"]
    if mode != "replay":
        bad += result["conflicts"]
    if mode == "replay" and result["created"] > 1:
        bad += result["created"] - 1
    if mode != "replay" and result["replayed"]:
        bad += result["replayed"]
    return int(bad)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--no-cpu", action="store_true", help="skip the in-process CPU part")
    parser.add_argument("--first-day", action="store_true", help="hybrid without a loss marker")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    table = routes(strategies, not args.no_replay)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"commit {commit or '?'}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; gunicorn --workers "
        f"{args.workers} --worker-class gthread --threads {args.threads}; wrk -t1 "
        f"-c{args.connections} -d{args.duration}s; {args.rounds} rounds of {len(table)} routes",
        flush=True,
    )
    prefix = f"idem-bench-{os.getpid()}"
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in table}
    bad = 0
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp, control_database() as url:
        env = control_env(url, prefix)
        script = os.path.join(tmp, "requests.lua")
        Path(script).write_text(WRK_SCRIPT)
        setup = "from control.bench import setup_django, quiet_loss_marker; setup_django()"
        if "hybrid" in strategies and not args.first_day:
            setup += "; quiet_loss_marker()"
        subprocess.run([sys.executable, "-c", setup], env=env, cwd=BENCHMARKS, check=True)
        try:
            with gunicorn(url, env, args.workers, args.threads) as base:
                for path, mode in table.values():  # warm up every route and connection
                    wrk(base + path, script, mode, 1, args.connections)
                names = list(table)
                for r in range(args.rounds):
                    order = names[r % len(names) :] + names[: r % len(names)]
                    for name in order:
                        path, mode = table[name]
                        result = wrk(base + path, script, mode, args.duration, args.connections)
                        runs[name].append(result)
                        bad += failed(name, mode, result)
                        print(f"  round {r + 1} {name:<22} {describe(result)}", flush=True)
        finally:
            clean_redis(prefix)
        if not args.no_cpu:
            print("\nIn-process client CPU per request (benchmarks/cpu.py):", flush=True)
            cpu = [sys.executable, str(BENCHMARKS / "cpu.py"), "--strategies", ",".join(strategies)]
            if args.no_replay:
                cpu.append("--no-replay")
            if args.first_day:
                cpu.append("--first-day")
            subprocess.run(cpu, check=True)

    print(
        f"\n{'route':<22} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6}  min-max "
        "(per-round ratio to plain)"
    )
    summary = []
    for name, results in runs.items():
        ratios = [m["rps"] / p["rps"] for m, p in zip(results, runs["plain"], strict=True)]
        row = {
            "route": name,
            "rps": statistics.median(r["rps"] for r in results),
            "p50_ms": statistics.median(r["p50_us"] for r in results) / 1000,
            "p99_ms": statistics.median(r["p99_us"] for r in results) / 1000,
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "runs": results,
        }
        summary.append(row)
        print(
            f"{name:<22} {row['rps']:8.1f} {row['p50_ms']:7.2f} {row['p99_ms']:7.2f} "
            f"{row['ratio']:6.2f}  {row['ratio_min']:.2f}-{row['ratio_max']:.2f}"
        )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if bad:
        print(f"WARNING: {bad} responses were not what the route must answer")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
