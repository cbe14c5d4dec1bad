"""The hybrid claim script on one Redis server under redis-benchmark load, against a bare claim.

Each case is one command that ``redis-benchmark`` (8 clients, one command in flight per
client, a fresh random key per request: every request is a new key) sends to a private
redis-server (no persistence) on a free loopback port:

* bare SET NX PX GET: the claim with no loss check, the floor any Redis claim pays
  (HYBRID_DB_CHECK = "always" sends it);
* hybrid claim script: ``CLAIM_LUA`` of the package (SET NX PX GET, then one MGET of the
  loss keys, and INFO at most once per ``loss_check_interval``), on a quiet loss marker;
* earlier hybrid claim script: the script that ran INFO server, INFO stats and TIME on every
  claim, kept here as the design measured against;
* a script of SET NX PX GET alone: what running any Lua script costs a claim (the floor of a
  claim that reads anything else in the same script).

For each it prints the requests per second (redis-benchmark's own count), the server time
per claim (``INFO commandstats`` microseconds of the top-level command, reset before each
case) and the commands the server ran per claim (every ``cmdstat`` call, inside the scripts
too). A claim is completed with one more command (``SET`` of the completed record, as the
hybrid strategy sends after COMMIT; the earlier design sent an EVALSHA that ran GET and SET):
the table adds it to the server-time and command columns of the claim+completion rows, as
measured on a ``SET PX`` case of the same round. The cases run in a new random order every
round; the ratios are taken within each round against the bare claim.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import shutil
import subprocess

import redis

from benchmarks.harness.cli import Measure
from benchmarks.harness.redis import redis_server
from benchmarks.harness.report import Column, Table, conditions, emit
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import Spread, ratio, spread

PREFIX = "bench"
RECORD = PREFIX + ":{__rand_int__}:rec"
IN_PROGRESS = json.dumps(
    {"s": "in_progress", "f": "f" * 64, "r": None, "t": "t" * 32}, separators=(",", ":")
)
COMPLETED = json.dumps(
    {"s": "completed", "f": "f" * 64, "r": {"c": 201, "h": {}, "b": "x" * 400}, "t": "t" * 32},
    separators=(",", ":"),
)
LEASE_MS, TTL_MS, INTERVAL_MS = "30000", "86400000", "10"

#: The claim script before: INFO server, INFO stats and TIME on every claim (one marker key
#: "<run_id> <evicted_keys> <since>").
BEFORE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local function loss_state(marker_key)
  local info = redis.call('INFO', 'server') .. redis.call('INFO', 'stats')
  local state = string.match(info, 'run_id:(%x+)') .. ' '
    .. string.match(info, 'evicted_keys:(%d+)')
  return state, tonumber(redis.call('TIME')[1]), redis.call('GET', marker_key)
end
local function loss_verdict(marker_key, ttl, state, now, marker)
  if marker then
    local written, since = string.match(marker, '^(%x+ %d+) (%d+)$')
    if written == state then
      if now < tonumber(since) + ttl then return 1 end
      return 0
    end
  end
  redis.call('SET', marker_key, state .. ' ' .. now)
  return 2
end
local old = redis.call('GET', KEYS[1])
if old then return {old, 0} end
local state, now, marker = loss_state(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {false, loss_verdict(KEYS[2], tonumber(ARGV[3]), state, now, marker)}
"""

BARE = "claim: bare SET NX PX GET"
HYBRID = "claim: hybrid claim script"
BEFORE = "claim: earlier hybrid claim script (INFO on every claim)"
FLOOR = "claim: script of SET NX PX GET alone"
FLOOR_LUA = "return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX', 'GET')"
COMPLETE = "completion: SET PX"


def sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def commands(client: redis.Redis) -> dict[str, list[str]]:
    """Each case's command line for redis-benchmark (scripts loaded, marker quiet)."""
    from django_idempotency.strategies.redis.store import CLAIM_LUA

    client.script_load(CLAIM_LUA)
    client.script_load(BEFORE_LUA)
    client.script_load(FLOOR_LUA)
    base = f"{PREFIX}:{{hybrid}}:"
    loss_keys = [base + "loss", base + "checked", base + "suspect"]
    before_marker = f"{PREFIX}:{{hybrid}}:epoch"
    return {
        BARE: ["SET", RECORD, IN_PROGRESS, "PX", LEASE_MS, "NX", "GET"],
        HYBRID: [
            "EVALSHA",
            sha(CLAIM_LUA),
            "4",
            RECORD,
            *loss_keys,
            IN_PROGRESS,
            LEASE_MS,
            TTL_MS,
            INTERVAL_MS,
            "0",
        ],
        BEFORE: [
            *("EVALSHA", sha(BEFORE_LUA), "2", RECORD, before_marker),
            *(IN_PROGRESS, LEASE_MS, "86400"),
        ],
        FLOOR: ["EVALSHA", sha(FLOOR_LUA), "1", RECORD, IN_PROGRESS, LEASE_MS],
        COMPLETE: ["SET", RECORD, COMPLETED, "PX", TTL_MS],
    }


def quiet(client: redis.Redis) -> None:
    """An empty server but for the loss markers of a server that lost nothing lately."""
    client.flushall()
    info = client.info("server") | client.info("stats")
    state = f"{info['run_id']} {info['evicted_keys']}"
    client.set(f"{PREFIX}:{{hybrid}}:loss", state)
    since = int(client.time()[0]) - 2 * 86400
    client.set(f"{PREFIX}:{{hybrid}}:epoch", f"{state} {since}")


def run_case(client: redis.Redis, port: int, argv: list[str], n: int) -> dict[str, float]:
    """One redis-benchmark run: rate, server µs per request, server commands per request."""
    quiet(client)
    client.config_resetstat()
    result = subprocess.run(
        [
            shutil.which("redis-benchmark") or "redis-benchmark",
            *("-h", "127.0.0.1", "-p", str(port), "-c", "8", "-n", str(n)),
            *("-r", "100000000", "--csv"),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rows = list(csv.reader(io.StringIO(result.stdout)))
    rate = float(rows[-1][-7])  # "rps", then six latency columns (the name may hold commas)
    # This INFO is not in its own answer; CONFIG (RESETSTAT, redis-benchmark's CONFIG GET)
    # is not the claim's.
    stats = client.info("commandstats")
    top = "cmdstat_" + argv[0].lower()
    calls = sum(s["calls"] for name, s in stats.items() if name != "cmdstat_config")
    return {
        "rate": rate,
        "usec": stats[top]["usec"] / n,
        "commands": calls / n,
    }


def measure(url: str, port: int, args: argparse.Namespace) -> list[Table]:
    client = redis.Redis.from_url(url)
    cases = commands(client)

    def run(name: str, _round: int) -> dict[str, float]:
        return run_case(client, port, cases[name], args.requests)

    results = interleave(list(cases), args.rounds, run, "shuffle")
    column = {name: {k: [r[k] for r in runs] for k in runs[0]} for name, runs in results.items()}
    table = Table(
        f"one redis-server, redis-benchmark -c 8: {args.requests} new keys x {args.rounds} rounds",
        [
            Column("case"),
            Column("requests/s", ".0f"),
            Column("server µs/request", ".2f"),
            Column("commands/request", ".2f"),
        ],
    )
    for name, values in column.items():
        table.add(name, spread(values["rate"]), spread(values["usec"]), spread(values["commands"]))
    completion = column[COMPLETE]
    old_completion = 3.0  # EVALSHA of the compare-and-set script: EVALSHA, GET, SET
    ratios = Table(
        "against the bare claim, within each round",
        [
            Column("case"),
            Column("throughput", ".2f"),
            Column("server time", ".2f"),
            Column("server time with completion", ".2f"),
            Column("commands with completion", ".2f"),
        ],
    )
    bare = column[BARE]
    bare_total = [c + s for c, s in zip(bare["usec"], completion["usec"], strict=True)]
    for name in (HYBRID, BEFORE, FLOOR):
        values = column[name]
        done = [c + s for c, s in zip(values["usec"], completion["usec"], strict=True)]
        extra = old_completion if name == BEFORE else 1.0
        ratios.add(
            name.removeprefix("claim: "),
            ratio(values["rate"], bare["rate"]),
            ratio(values["usec"], bare["usec"]),
            ratio(done, bare_total),
            _plus(values["commands"], extra),
        )
    return [table, ratios]


def _plus(values: list[float], extra: float) -> Spread:
    return spread([v + extra for v in values])


def options(parser: argparse.ArgumentParser) -> None:
    del parser  # the shared options only


def run(args: argparse.Namespace) -> int:
    print(
        conditions(f"{args.rounds} rounds of {args.requests} new keys per case, 8 clients"),
        flush=True,
    )
    with redis_server() as (url, port):
        tables = measure(url, port, args)
    emit(tables, args.json)
    return 0


MEASURE = Measure(
    __doc__, run, options, rounds=5, requests=200_000, quick={"rounds": 3, "requests": 20_000}
)
