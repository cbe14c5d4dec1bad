"""The capacity measure's result tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.harness.report import Column, Table
from benchmarks.harness.stats import ratio, spread

#: The count columns, with their formats.
COUNTS = (
    ("statements", ".2f"),
    ("COMMIT sent", ".2f"),
    ("write transactions", ".2f"),
    ("key table row versions", ".2f"),
    ("WAL bytes", ".0f"),
    ("FPI", ".3f"),
)
REDIS = (
    ("Redis commands", ".2f"),
    ("Redis bytes in", ".0f"),
    ("Redis bytes out", ".0f"),
    ("Redis keys left", ".2f"),
    ("Redis memory bytes", ".0f"),
)


def counts(found: Sequence[tuple[str, str, dict[str, Any]]]) -> list[Table]:
    pg = Table("PostgreSQL, per new key / replay / drained row (one pass, after a CHECKPOINT)",
               [Column("case"), Column("per"), *(Column(h, f) for h, f in COUNTS)])  # fmt: skip
    redis = Table("Redis, per new key / replay",
                  [Column("case"), Column("per"), *(Column(h, f) for h, f in REDIS),
                   Column("commands by name")])  # fmt: skip
    for case, per, figures in found:
        pg.add(case, per, *(float(figures[h]) for h, _f in COUNTS))
        if figures["Redis commands"] or case.startswith("hybrid") or case == "redis":
            redis.add(case, per, *(float(figures[h]) for h, _f in REDIS),
                      figures["Redis commands by name"])  # fmt: skip
    pg.note = ("statements: pg_stat_statements (BEGIN/COMMIT apart); write transactions: "
               "Transaction/COMMIT records in the WAL; FPI: pg_stat_wal.wal_fpi")  # fmt: skip
    redis.note = (
        "commands: INFO commandstats (a script's commands included); memory: MEMORY USAGE "
        "of the keys the pass left"
    )
    return [pg, redis]


def speed(results: dict[str, list[tuple[float, float]]], strategies: Sequence[str]) -> Table:
    table = Table(
        "New keys per second, one thread, median (min-max) of the rounds",
        [Column("strategy"), Column("keys/s", ",.0f"), Column("raw keys/s", ",.0f"),
         Column("strategy ÷ raw", ".2f"), Column("client CPU µs/key", ".0f"),
         Column("raw CPU µs/key", ".0f")],
    )  # fmt: skip
    for name in strategies:
        mine, raw = results[name], results[f"{name} raw"]
        rates, raw_rates = [r for r, _c in mine], [r for r, _c in raw]
        table.add(name, spread(rates), spread(raw_rates), ratio(rates, raw_rates),
                  spread([c for _r, c in mine]), spread([c for _r, c in raw]))  # fmt: skip
    return table


def drain(results: dict[str, list[dict[str, float]]], workers: int) -> Table:
    table = Table(
        f"Outbox drain, {workers} worker(s), batches of 1,000, median (min-max) of the rounds",
        [Column("case"), Column("rows/s per worker", ",.0f"), Column("WAL bytes/row", ".0f"),
         Column("client CPU µs/row", ".1f"), Column("rows/s ÷ reference", ".2f")],
    )  # fmt: skip
    base = [f["rows/s"] for f in results["reference"]]
    for case, rounds in results.items():
        rate = [f["rows/s"] for f in rounds]
        table.add(case, spread([r / workers for r in rate]), spread([f["wal"] for f in rounds]),
                  spread([f["cpu"] for f in rounds]), ratio(rate, base))  # fmt: skip
    return table


def purge(results: list[dict[str, Any]]) -> Table:
    table = Table(
        "Purge of expired keys (batches of 1,000), median (min-max) of the rounds",
        [Column("path"), Column("rows/s", ",.0f"), Column("batch ms, median", ".1f"),
         Column("batch ms, longest", ".1f")],
    )  # fmt: skip
    table.add(
        "statement",
        spread([f["rows/s"] for f in results]),
        spread([f["median"] for f in results]),
        spread([f["longest"] for f in results]),
    )
    return table


def storage(found: dict[str, float]) -> Table:
    table = Table("Key table, bytes per completed row (300-byte response)",
                  [Column("part"), Column("bytes/row", ".0f")])  # fmt: skip
    for name, value in found.items():
        table.add(name, value)
    return table
