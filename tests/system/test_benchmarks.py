"""The benchmark harness: every measure answers ``--help``, the statistics are right, the
rounds interleave, ``--quick`` applies, and the cheapest measure runs to the end.

The benchmarks measure speed; these tests only check that the harness computes and prints
what it says, on numbers known in advance, and that a measure still runs (the claim loops on
SQLite, which need no server).
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import measures
from benchmarks.harness import cli
from benchmarks.harness.postgres import server_bindir
from benchmarks.harness.report import Column, Table
from benchmarks.harness.rounds import interleave, orders
from benchmarks.harness.stats import Spread, ratio, spread
from benchmarks.measures import MEASURES

from ..support.docs import python_blocks

ROOT = Path(__file__).resolve().parents[2]


def benchmarks(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks *args`` from the checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("name", list(MEASURES))
def test_every_measure_answers_help(name: str) -> None:
    result = benchmarks(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m benchmarks {name} ")
    summary = (cli.load(name).doc or "").strip().splitlines()[0]
    assert summary in result.stdout
    assert "--quick" in result.stdout and "--json" in result.stdout


def test_the_listing_names_every_measure() -> None:
    result = benchmarks("--help")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.split("measures:\n", 1)[1].splitlines()]
    assert listed == list(MEASURES)


def test_an_unknown_measure_is_refused() -> None:
    result = benchmarks("no-such-measure")
    assert result.returncode == 2
    assert "no measure 'no-such-measure'" in result.stderr


def test_every_measure_module_is_registered_once() -> None:
    modules = {f"benchmarks.measures.{m.name}" for m in pkgutil.iter_modules(measures.__path__)}
    assert sorted(MEASURES.values()) == sorted(modules)
    for name in MEASURES:
        assert isinstance(cli.load(name), cli.Measure)


def test_nothing_in_benchmarks_imports_the_tests() -> None:
    importers = []
    for path in (ROOT / "benchmarks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(name == "tests" or name.startswith("tests.") for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []


def test_a_ratio_is_taken_within_each_round() -> None:
    # Rounds of 2/1, 4/2, 6/2: ratios 2, 2, 3.
    assert ratio([2, 4, 6], [1, 2, 2]) == Spread(median=2, low=2, high=3)
    # Four rounds: the median is the mean of the middle two, 1.5 and 2.5.
    assert ratio([3, 5, 1, 8], [2, 2, 1, 2]) == Spread(median=2.0, low=1.0, high=4.0)
    # Not the ratio of the medians (6 / 2 = 3 here): each round is paired with its own.
    assert ratio([1, 6, 100], [1, 2, 100]).median == 1.0


def test_a_cost_ratio_is_the_baseline_over_the_candidate() -> None:
    plain, route = [2.0, 3.0, 4.0], [4.0, 4.0, 5.0]
    assert ratio(plain, route) == Spread(median=0.75, low=0.5, high=0.8)


def test_rounds_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="3 rounds against 2"):
        ratio([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="no values"):
        spread([])


def test_a_spread_prints_its_median_then_its_range() -> None:
    assert spread([0.56, 0.80, 0.66]).format() == "0.66 (0.56-0.80)"
    assert spread([1200.4, 980.0, 1500.9]).format(".0f") == "1200 (980-1501)"


def test_rotated_rounds_start_one_case_later_each_round() -> None:
    assert orders(["a", "b", "c"], 4) == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert orders(["a", "b", "c"], 3, "flip") == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_shuffled_rounds_are_the_same_every_run_and_run_every_case() -> None:
    first = orders(list("abcdef"), 5, "shuffle")
    assert first == orders(list("abcdef"), 5, "shuffle")
    assert all(sorted(order) == list("abcdef") for order in first)
    assert len({tuple(order) for order in first}) > 1


def test_interleave_runs_every_case_once_per_round_in_the_round_order() -> None:
    calls: list[tuple[str, int]] = []
    seen: list[dict[str, int]] = []

    def run(name: str, r: int) -> int:
        calls.append((name, r))
        return 10 * r + "abc".index(name)

    results = interleave(["a", "b", "c"], 2, run, "flip", lambda r, this: seen.append(this))
    assert calls == [("a", 0), ("b", 0), ("c", 0), ("c", 1), ("b", 1), ("a", 1)]
    assert results == {"a": [0, 10], "b": [1, 11], "c": [2, 12]}
    # progress gets each round's results in the order of the names, whatever the run order.
    assert [list(this) for this in seen] == [["a", "b", "c"], ["a", "b", "c"]]


def test_quick_sets_the_options_not_given() -> None:
    measure = cli.load("claim")
    args = cli.parse("claim", measure, ["--quick", "--rounds", "5"])
    assert args.rounds == 5  # given: it wins
    assert args.requests == measure.quick["requests"]
    assert args.sqlite_requests == measure.quick["sqlite_requests"]
    assert args.argv == ["--quick", "--rounds", "5"]
    full = cli.parse("claim", measure, [])
    assert (full.rounds, full.requests) == (measure.rounds, measure.requests)


def test_a_table_aligns_its_columns_and_keeps_raw_numbers_for_json() -> None:
    table = Table("t", [Column("case"), Column("per s", ".0f"), Column("ratio", ".2f")])
    table.add("baseline", 1000.4, spread([1.0, 1.0]))
    table.add("candidate", 512.0, ratio([0.5, 0.6, 0.4], [1.0, 1.0, 1.0]))
    assert table.render().splitlines() == [
        "t",
        "case       per s             ratio",
        "baseline    1000  1.00 (1.00-1.00)",
        "candidate    512  0.50 (0.40-0.60)",
    ]
    assert table.as_dict()["rows"][1] == {
        "case": "candidate",
        "per s": 512.0,
        "ratio": {"median": 0.5, "min": 0.4, "max": 0.6},
    }


def test_a_quick_claim_run_on_sqlite_completes(tmp_path: Path) -> None:
    out = tmp_path / "claim.json"
    result = benchmarks(
        "claim", "--quick", "--cases", "db-sqlite", "--rounds", "2", "--json", str(out),
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (table,) = json.loads(out.read_text())["tables"]
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["raw sqlite3", "strategy db", "manager claim/complete"]
    assert rows["raw sqlite3"]["ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert all(row["per s"]["min"] > 0 for row in rows.values())
    assert "db-sqlite: 300 claim+complete per run, 2 runs each" in result.stdout


def test_the_example_measure_of_the_docs_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/benchmarks.md's example of a new measure is a working one."""
    code = python_blocks("benchmarks.md", "Adding a measure")[0]
    namespace: dict[str, Any] = {"__name__": "header_parse"}
    exec(compile(code, "docs/benchmarks.md#adding-a-measure", "exec"), namespace)
    measure = namespace["MEASURE"]
    assert isinstance(measure, cli.Measure)
    assert measure.run(cli.parse("header-parse", measure, ["--quick"])) == 0
    out = capsys.readouterr().out
    assert "2 rounds x 2000 parses" in out
    assert re.search(r"^bare\s+\S+ \(\S+\)\s+1\.00 \(1\.00-1\.00\)$", out, re.M), out
    assert re.search(r"^sf-string\s+\S+ \(\S+\)\s+\d+\.\d\d \(", out, re.M), out


def test_all_takes_only_quick() -> None:
    result = benchmarks("all", "--rounds", "3")
    assert result.returncode == 2
    assert "usage: python -m benchmarks all [--quick]" in result.stderr


@pytest.mark.skipif(
    server_bindir() is None or shutil.which("redis-server") is None,
    reason="needs initdb/pg_ctl/pg_waldump and redis-server",
)
def test_the_capacity_counts_are_what_each_strategy_sends(tmp_path: Path) -> None:
    """``capacity``'s counts through the real strategies, on its private servers: exact
    (they do not depend on the machine), so they are asserted; its speeds are not."""
    out = tmp_path / "capacity.json"
    result = benchmarks(
        "capacity", "--quick", "--stages", "counts", "--requests", "50", "--rows", "2000",
        "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _storage, pg_table, redis_table = json.loads(out.read_text())["tables"]
    pg = {(row["case"], row["per"]): row for row in pg_table["rows"]}
    redis = {(row["case"], row["per"]): row for row in redis_table["rows"]}
    # db: the claim INSERT in autocommit, then the completion UPDATE and its COMMIT.
    assert pick(pg[("db", "new key")]) == (2, 1, 2, 2)
    # advisory_lock: lock, read, upsert in one transaction.
    assert pick(pg[("advisory_lock", "new key")]) == (3, 1, 1, 1)
    for strategy in ("db", "advisory_lock"):
        assert pg[(strategy, "replay")]["statements"] == 2
    # redis: asks the view's transaction for its id before the completion (that view
    # writes nothing: it has none, is given none, and stays read-only); a replay, nothing.
    assert pick(pg[("redis", "new key")]) == (1, 1, 0, 0)
    assert pick(pg[("redis", "replay")]) == (0, 0, 0, 0)
    for per in ("new key", "replay"):
        assert pg[("redis", per)]["WAL bytes"] == 0
    # redis: SET NX PX GET, then the completion script (GET, SET); a replay is one SET NX GET.
    assert redis[("redis", "new key")]["Redis commands"] == 4
    assert redis[("redis", "replay")]["Redis commands"] == 1
    assert redis[("redis", "new key")]["Redis keys left"] == 1
    # hybrid: one write transaction per new key (the outbox row with the view's COMMIT),
    # nothing in the key table until the drain writes one row version per row.
    assert pg[("hybrid", "new key")]["write transactions"] == 1
    assert pg[("hybrid", "new key")]["key table row versions"] == 0
    assert pg[("hybrid drain", "per row")]["key table row versions"] == 1
    assert pg[("hybrid", "replay")]["statements"] == 0
    for key, row in redis.items():  # whole commands over the 50 keys
        total = row["Redis commands"] * 50
        assert abs(total - round(total)) < 1e-6, key
    assert redis[("hybrid", "replay")]["Redis commands"] >= 1
    assert redis[("hybrid", "new key")]["Redis memory bytes"] > 300  # the 300-byte body


def pick(row: dict[str, Any]) -> tuple[float, ...]:
    names = ("statements", "COMMIT sent", "write transactions", "key table row versions")
    return tuple(row[name] for name in names)


def test_the_budget_skips_every_function_but_the_parts_and_the_bottom_of_the_stack() -> None:
    from fnmatch import fnmatchcase

    from benchmarks.measures.budget.callgrind import KEEP, loader_entry, skip_patterns

    patterns = skip_patterns()
    assert not any("?" in p[:-1] or "*" in p[:-1] for p in patterns)  # no wildcard inside

    def skipped(name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in patterns)

    # A function without a symbol is named by its address: skipped, but for the loader's entry.
    for name in ("_PyEval_EvalFrameDefault", "PyObject_Call", "malloc", "memcpy", "pq_exec",
                 "budget_hook", "_stat", "x", "0x00000000000fe120"):  # fmt: skip
        assert skipped(name), name
    for name in ("budget_part_7", "budget_part_root", "_start", "(below main)", loader_entry(),
                 "_dl_runtime_resolve_xsave", "__libc_start_main", "main"):  # fmt: skip
        assert not skipped(name), name
    assert all(not skipped(prefix) for prefix in KEEP)
    assert loader_entry().startswith("0x") and len(loader_entry()) == 18


def test_the_budget_reads_a_part_s_own_instructions_from_a_dump(tmp_path: Path) -> None:
    """Self cost plus the calls to unskipped functions that are not parts; a call into
    another part is that part's."""
    from benchmarks.measures.budget.callgrind import read_dump

    dump = tmp_path / "callgrind.out.1"
    dump.write_text(
        "desc: Trigger: Client Request: db-replay\npositions: line\nevents: Ir\n"
        "summary: 1000\n\n"
        "fn=(1) budget_part_root\n0 100\ncfn=(2) budget_part_6\ncalls=1 0\n0 850\n\n"
        "fn=(2)\n0 300\ncfn=(3) budget_part_8\ncalls=2 0\n0 500\n"
        "cfn=(4) __libc_calloc\ncalls=1 0\n0 50\n\n"
        "fn=(3)\n+2 500\n\nfn=(5) (below main)\n0 7\ntotals: 1000\n"
    )
    trigger, total, parts = read_dump(dump)
    assert (trigger, total) == ("db-replay", 1000)
    assert parts == {0: 100, 6: 350, 8: 500, -1: 50}


CALLGRIND_SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {tmp!r}]
from benchmarks.measures.budget.native import load
import light, heavy

parts = load()
parts.install(lambda code: {{"light": (2, 2), "heavy": (4, 4)}}.get(
    code.co_filename.rsplit("/", 1)[-1][:-3], (-1, -1)), (2, 3, 4))
parts.run(light.work)  # each code object's part is asked once, before the counting
parts.collect()
parts.run(light.work)
parts.collect()
parts.dump("work")
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (make valgrind)")
def test_callgrind_files_each_frame_under_its_part(tmp_path: Path) -> None:
    """The evaluator and the skipped functions, end to end on a known workload: ``light``
    calls ``heavy`` ten times, which loops ten times longer than ``light`` does itself."""
    from benchmarks.measures.budget import callgrind

    (tmp_path / "light.py").write_text(
        "import heavy\n\ndef work():\n    s = 0\n    for i in range(2000):\n        s += i\n"
        "    for _ in range(10):\n        s += heavy.work()\n    return s\n"
    )
    (tmp_path / "heavy.py").write_text(
        "def work():\n    s = 0\n    for i in range(2000):\n        s += i\n    return s\n"
    )
    script = tmp_path / "script.py"
    script.write_text(CALLGRIND_SCRIPT.format(root=str(ROOT), tmp=str(tmp_path)))
    out = tmp_path / "callgrind.out"
    subprocess.run(
        [*callgrind.options(str(out)), sys.executable, str(script)],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    dumps = [callgrind.read_dump(path) for path in tmp_path.glob("callgrind.out.*")]
    ((_trigger, total, parts),) = [dump for dump in dumps if dump[0] == "work"]
    light, heavy = parts.get(2, 0), parts.get(4, 0)
    assert light > 0 and 8 < heavy / light < 12, parts
    # Nearly everything is filed under a part: what is not is the calls into the parts.
    assert light + heavy + parts.get(0, 0) > 0.95 * total, parts


def test_a_tiny_budget_runs_and_files_every_route_under_its_parts(tmp_path: Path) -> None:
    """The budget command end to end, in its smallest run, the CPU side (what it measures
    is not asserted: the machine's speed is not the test's; the callgrind side, which takes
    minutes under valgrind for Django's start-up alone, is the test above on a small
    workload)."""
    out = tmp_path / "budget.json"
    result = benchmarks(
        "budget", "--quick", "--no-instructions", "--strategies", "db", "--rounds", "1",
        "--requests", "2", "--json", str(out), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    tables = json.loads(out.read_text())["tables"]
    assert [t["title"].split(",")[:2] for t in tables] == [
        ["Client CPU per request", " new key (µs"], ["Client CPU per request", " replay (µs"],
    ]  # fmt: skip
    new_key = {row["part"]: row for row in tables[0]["rows"]}
    assert list(tables[0]["rows"][0]) == [
        "part", "plain", "db", "hand-db", "hand-redis",
    ]  # fmt: skip
    # The library's parts are the library's: the plain view has none of them.
    assert new_key["fingerprint"]["plain"] == 0 and new_key["fingerprint"]["db"] > 0
    assert new_key["the same work by hand"]["hand-db"] > 0
    assert new_key["ratio plain ÷ route"]["plain"] == "1.00 (1.00-1.00)"
    replay = {row["part"]: row for row in tables[1]["rows"]}
    assert replay["driver calls (psycopg, redis-py)"]["db"] > 0
