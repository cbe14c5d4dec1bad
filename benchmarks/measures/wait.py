"""How long a duplicate needs to get its answer: waiting (WAIT) against 409 + retry.

For each strategy the example payments API runs under gunicorn (2 workers x 4 threads) with
a slow payment call (--delay-ms), on a scratch database: one server with IDEMPOTENCY_WAIT
set (the duplicate waits for the first request's answer) and one without (the duplicate gets
a 409 and retries after its Retry-After, as a well-behaved client does), both up at once.
Each round sends a request with a fresh key to each server in turn (the order flips every
round), then, --lag-ms later, a duplicate, and times the duplicate from its first send to its
201. Reported per strategy: the seconds of both, median (min-max), and the ratio 409 + retry
/ waiting within each round. sqlite-db is the db strategy on SQLite; redis and hybrid use a
private redis-server.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from contextlib import ExitStack
from typing import Any

from benchmarks.harness.cli import Measure
from benchmarks.harness.example import TOKEN, example_database, example_server
from benchmarks.harness.redis import redis_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread
from benchmarks.harness.web import request

BODY = {"amount": 1000, "currency": "EUR"}
STRATEGIES = {
    # name: (database kind, strategy)
    "db": ("postgres", "db"),
    "sqlite-db": ("sqlite", "db"),
    "advisory_lock": ("postgres", "advisory_lock"),
    "redis": ("postgres", "redis"),
    "hybrid": ("postgres", "hybrid"),
}


def duplicate_latency(url: str, lag: float) -> tuple[float, int]:
    """A request with a fresh key, then ``lag`` seconds later its duplicate: the seconds from
    the duplicate's first send to its 201, and how many requests it sent."""
    key = uuid.uuid4().hex
    kwargs: dict[str, Any] = {"key": key, "body": BODY, "token": TOKEN}
    first = threading.Thread(target=request, args=(url,), kwargs=kwargs)
    first.start()
    time.sleep(lag)
    started = time.perf_counter()
    sent = 0
    while True:
        status, body = request(url, **kwargs)
        sent += 1
        if status == 201:
            break
        if status != 409:
            raise RuntimeError(f"unexpected answer {status}: {body}")
        time.sleep(float(body["_headers"].get("retry-after", "1")))
    elapsed = time.perf_counter() - started
    first.join(30)
    return elapsed, sent


def measure(name: str, args: argparse.Namespace, table: Table) -> None:
    kind, strategy = STRATEGIES[name]
    lag = args.lag_ms / 1000
    with ExitStack() as stack:
        env = {}
        if strategy in ("redis", "hybrid"):
            env["REDIS_URL"] = stack.enter_context(redis_server())[0]
        database = stack.enter_context(example_database(kind))
        urls = {}
        for mode, wait in (("wait", str(args.wait)), ("409+retry", "0")):
            server = stack.enter_context(example_server(
                database, strategy, workers=2, threads=4, psp_delay_ms=args.delay_ms,
                env={**env, "IDEMPOTENCY_WAIT": wait},
            ))  # fmt: skip
            urls[mode] = server.url + "/api/charges/"
            duplicate_latency(urls[mode], lag)  # warm-up
        runs = interleave(
            list(urls), args.rounds, lambda m, _r: duplicate_latency(urls[m], lag), "flip"
        )
    seconds = {mode: [s for s, _sent in results] for mode, results in runs.items()}
    sends = spread([sent for _s, sent in runs["409+retry"]]).median
    table.add(name, spread(seconds["wait"]), spread(seconds["409+retry"]), sends,
              ratio(seconds["409+retry"], seconds["wait"]))  # fmt: skip
    print(f"  {name}: done", flush=True)


def options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--delay-ms", type=int, default=500, help="the payment call's delay (default: %(default)s)")
    add("--lag-ms", type=int, default=50, help="the duplicate's lag (default: %(default)s)")
    add(
        "--wait",
        type=float,
        default=5.0,
        help="IDEMPOTENCY_WAIT of the waiting server (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    print(conditions(
        f"duplicate sent {args.lag_ms} ms after the first request; view {args.delay_ms} ms; "
        f"{args.rounds} rounds"
    ), flush=True)  # fmt: skip
    table = Table(
        "Seconds from the duplicate's first send to its answer, median (min-max)",
        [Column("strategy"), Column("waiting (WAIT)", ".3f"), Column("409 + retry", ".3f"),
         Column("requests sent", ".0f"), Column("ratio", ".2f")],
    )  # fmt: skip
    for name in args.strategies:
        measure(name, args, table)
    emit([table], args.json)
    return 0


MEASURE = Measure(
    __doc__,
    run,
    options,
    rounds=10,
    strategies=tuple(STRATEGIES),
    quick={"rounds": 3, "strategies": ["db"], "delay_ms": 200},
)
