"""A case of the claim measure: its variants (one the baseline) timed in interleaved rounds
on one table, emptied before each run, and the table of their rates."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from dataclasses import dataclass, field

from benchmarks.harness.report import Column, Table
from benchmarks.harness.rounds import interleave
from benchmarks.harness.stats import ratio, spread

from .loops import Loop, table


@dataclass
class Variant:
    name: str
    loop: Loop
    baseline: bool = False
    note: str = ""
    rates: list[float] = field(default_factory=list)
    #: This process's CPU time per iteration (µs), run by run: the client-side cost, which
    #: other load on the machine changes far less than the wall-clock rate.
    cpu_us: list[float] = field(default_factory=list)


@dataclass
class Case:
    name: str
    alias: str
    iterations: int
    variants: list[Variant]

    @property
    def baseline(self) -> Variant:
        return next(v for v in self.variants if v.baseline)

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def empty_table(alias: str) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute(f'TRUNCATE "{table()}"')
        else:
            cursor.execute(f'DELETE FROM "{table()}"')


def completed_rows(alias: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM \"{table()}\" WHERE status = 'completed'")
        return int(cursor.fetchone()[0])


def measure(case: Case, variant: Variant, prefix: str) -> float:
    """One run of ``variant`` on an empty table: claims + completions per second."""
    empty_table(case.alias)
    cpu = time.process_time()
    start = time.perf_counter()
    variant.loop(case.iterations, prefix)
    elapsed = time.perf_counter() - start
    variant.cpu_us.append((time.process_time() - cpu) / case.iterations * 1e6)
    done = completed_rows(case.alias)
    if done != case.iterations:
        raise RuntimeError(
            f"{case.name}/{variant.name}: {done} completed rows, not {case.iterations}"
        )
    return case.iterations / elapsed


def run_case(case: Case, rounds: int, warmup: int) -> None:
    """Warm every variant up (connections, caches, prepared statements), then ``rounds``
    rounds, the variants' order flipping every round."""
    print(f"\n{case.name}", flush=True)
    for variant in case.variants:
        empty_table(case.alias)
        variant.loop(warmup, f"warm-{variant.name}")

    def run(name: str, r: int) -> float:
        rate = measure(case, case.variant(name), f"r{r}-{name}")
        case.variant(name).rates.append(rate)
        return rate

    def progress(r: int, rates: dict[str, float]) -> None:
        line = "  ".join(f"{name} {rates[name]:8.0f}/s" for name in rates)
        print(f"  round {r + 1}/{rounds}: {line}", flush=True)

    interleave([v.name for v in case.variants], rounds, run, "flip", progress)


def report(case: Case) -> Table:
    """Per variant: the median rate with its spread, µs per claim + complete, the ratio to
    the baseline's rate within each round, and the client CPU per claim + complete."""
    runs = len(case.baseline.rates)
    result = Table(
        f"{case.name}: {case.iterations} claim+complete per run, {runs} runs each",
        [Column("variant"), Column("per s", ".0f"), Column("µs/op", ".0f"),
         Column("ratio", ".2f"), Column("cpu µs/op", ".0f"), Column("note")],
    )  # fmt: skip
    for v in case.variants:
        rates = spread(v.rates)
        result.add(
            v.name,
            rates,
            1e6 / rates.median,
            ratio(v.rates, case.baseline.rates),
            spread(v.cpu_us).median,
            v.note,
        )
    return result


def profile(case: Case, variant_name: str) -> None:
    """cProfile one run of a variant instead of measuring it."""
    variant = case.variant(variant_name)
    empty_table(case.alias)
    profiler = cProfile.Profile()
    profiler.enable()
    variant.loop(case.iterations, "profile")
    profiler.disable()
    for sort in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(30)
        print(f"\n--- cProfile of {case.name}/{variant_name}, by {sort} ---")
        print(out.getvalue())
