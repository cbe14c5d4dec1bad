"""Instructions per request of each control route, counted by callgrind (load-independent).

Each route runs in a process of its own under ``valgrind --tool=callgrind``, once with no
measured requests and once with ``--requests``; the difference divided by the requests is
the route's user-space instructions per request (the kernel's work per round trip, the
servers' work and the time spent waiting are not in it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.harness.control import control_run
from benchmarks.harness.paths import benchmark_command
from benchmarks.harness.report import Column, Table, emit

from .worker import routes


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
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no totals")


def instructions(args: argparse.Namespace) -> int:
    names = routes(args.strategies, not args.no_replay)
    table = Table(
        f"Instructions per request (callgrind, {args.requests} requests per route)",
        [Column("route"), Column("M instructions/request", ".3f"), Column("ratio to plain", ".2f")],
    )
    per_request: dict[str, float] = {}
    with control_run() as env:
        # Migrate once outside the measured processes.
        worker = benchmark_command("cpu", "--worker", "--only", "plain", "--requests", "0")
        subprocess.run(worker, env=env, check=True)
        for name in names:
            base = benchmark_command("cpu", "--worker", "--only", name)
            empty = callgrind_total([*base, "--requests", "0"], env)
            full = callgrind_total([*base, "--requests", str(args.requests)], env)
            per_request[name] = (full - empty) / args.requests
            plain_ratio = per_request["plain"] / per_request[name]
            table.add(name, per_request[name] / 1e6, plain_ratio)
            print(
                f"{name:<22} {per_request[name] / 1e6:8.3f} M instructions/request  "
                f"ratio to plain {plain_ratio:5.2f}",
                flush=True,
            )
    emit([table], args.json)
    return 0
