"""How long a duplicate needs to get its answer: waiting (``WAIT``) against 409 + retry.

For each strategy the example payments API runs under gunicorn with a slow payment call
(``--delay-ms``, default 500), twice: with ``IDEMPOTENCY_WAIT`` set (the duplicate
waits for the first request's answer) and without (the duplicate gets a 409 and retries
after its ``Retry-After``, as a well-behaved client does). Each round sends a request
with a fresh key, then, ``--lag-ms`` later, a duplicate, and times the duplicate from
its first send to its 201. Reported per strategy: min / median / max of both, and the
ratio of the medians.

    .venv/bin/python benchmarks/wait.py [--strategies db,sqlite-db,advisory_lock,redis,hybrid]
        [--rounds 10] [--delay-ms 500] [--lag-ms 50] [--json results.json]

``redis`` and ``hybrid`` use ``BENCH_REDIS_URL`` (default: the test Redis) under a fresh
key prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.example import example_server, request, scratch_database  # noqa: E402
from tests.support.services import REDIS_URL  # noqa: E402

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
BODY = {"amount": 1000, "currency": "EUR"}
STRATEGIES = {
    # name: (database kind, strategy)
    "db": ("postgres", "db"),
    "sqlite-db": ("sqlite", "db"),
    "advisory_lock": ("postgres", "advisory_lock"),
    "redis": ("postgres", "redis"),
    "hybrid": ("postgres", "hybrid"),
}


def duplicate_latency(url: str, key: str, lag: float) -> tuple[float, int]:
    """Seconds from the duplicate's first send to its 201, and how many requests it sent."""
    first = threading.Thread(target=request, args=(url,), kwargs={"key": key, "body": BODY})
    first.start()
    time.sleep(lag)
    started = time.perf_counter()
    sent = 0
    while True:
        status, body = request(url, key=key, body=BODY)
        sent += 1
        if status == 201:
            break
        if status != 409:
            raise RuntimeError(f"unexpected answer {status}: {body}")
        time.sleep(float(body["_headers"].get("retry-after", "1")))
    elapsed = time.perf_counter() - started
    first.join(30)
    return elapsed, sent


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    kind, strategy = STRATEGIES[name]
    env: dict[str, str] = {}
    if strategy in ("redis", "hybrid"):
        env = {
            "REDIS_URL": os.environ.get("BENCH_REDIS_URL", REDIS_URL),
            "IDEMPOTENCY_REDIS_PREFIX": "bench-wait-" + uuid.uuid4().hex[:8],
        }
    result: dict[str, Any] = {}
    with scratch_database(kind, admin_url=ADMIN_URL) as db:
        for mode, wait in (("wait", str(args.wait)), ("409+retry", "0")):
            with example_server(
                db,
                strategy=strategy,
                psp_delay_ms=args.delay_ms,
                workers=2,
                threads=4,
                env={**env, "IDEMPOTENCY_WAIT": wait},
            ) as server:
                url = server.url + "/api/charges/"
                duplicate_latency(url, uuid.uuid4().hex, args.lag_ms / 1000)  # warm-up
                times, sends = [], []
                for _ in range(args.rounds):
                    seconds, sent = duplicate_latency(url, uuid.uuid4().hex, args.lag_ms / 1000)
                    times.append(seconds)
                    sends.append(sent)
                result[mode] = {
                    "min": min(times),
                    "median": statistics.median(times),
                    "max": max(times),
                    "requests": statistics.median(sends),
                }
    result["ratio"] = result["409+retry"]["median"] / result["wait"]["median"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--delay-ms", type=int, default=500)
    parser.add_argument("--lag-ms", type=int, default=50)
    parser.add_argument("--wait", type=float, default=5.0, help="IDEMPOTENCY_WAIT of the run")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    print(
        f"duplicate sent {args.lag_ms} ms after the first request; view {args.delay_ms} ms; "
        f"{args.rounds} rounds; seconds min / median / max"
    )
    print(f"{'strategy':<14} {'waiting (WAIT)':<24} {'409 + retry':<24} ratio")
    for name in args.strategies.split(","):
        r = results[name] = run(name, args)
        w, c = r["wait"], r["409+retry"]
        print(
            f"{name:<14} {w['min']:.3f} / {w['median']:.3f} / {w['max']:.3f}    "
            f"{c['min']:.3f} / {c['median']:.3f} / {c['max']:.3f}    {r['ratio']:.2f}x",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
