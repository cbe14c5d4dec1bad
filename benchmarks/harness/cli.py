"""The command line: ``python -m benchmarks <measure> [options]`` and ``... all [--quick]``.

Every measure gets the same options for the same things: ``--rounds`` (interleaved rounds),
``--requests`` (requests or operations per case and round), ``--strategies`` (a comma-
separated list), ``--quick`` (the short run ``make bench`` makes: the measure's ``quick``
values for the options not given), ``--json FILE`` (the result tables, unformatted). A
measure declares which of the first three it takes, with its defaults, and adds its own.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.measures import MEASURES

from .paths import benchmark_command


@dataclass(frozen=True)
class Measure:
    """What a measure module exports as ``MEASURE``.

    ``doc`` is the help text (the module's docstring; its first line is the summary that
    ``python -m benchmarks --help`` lists); ``run(args)`` measures and returns the exit
    status; ``options(parser)`` adds the measure's own options. ``rounds``, ``requests``
    and ``strategies`` are the defaults of the shared options, None for a measure that does
    not take one; ``quick`` the option values of ``--quick``."""

    doc: str | None
    run: Callable[[argparse.Namespace], int]
    options: Callable[[argparse.ArgumentParser], None] | None = None
    rounds: int | None = None
    requests: int | None = None
    strategies: Sequence[str] | None = None
    quick: Mapping[str, Any] = field(default_factory=dict)


def names(value: str) -> list[str]:
    """``"db,redis"`` -> ``["db", "redis"]``."""
    return [name for name in value.split(",") if name]


def load(name: str) -> Measure:
    measure = importlib.import_module(MEASURES[name]).MEASURE
    assert isinstance(measure, Measure), name
    return measure


def parser_for(name: str, measure: Measure) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}",
        description=measure.doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if measure.rounds is not None:
        parser.add_argument(
            "--rounds",
            type=int,
            default=measure.rounds,
            help="rounds, interleaved (default: %(default)s)",
        )
    if measure.requests is not None:
        parser.add_argument(
            "--requests",
            type=int,
            default=measure.requests,
            help="requests (or operations) per case and round (default: %(default)s)",
        )
    if measure.strategies is not None:
        parser.add_argument(
            "--strategies",
            type=names,
            default=list(measure.strategies),
            help=f"comma-separated (default: {','.join(measure.strategies)})",
        )
    quick = " ".join(f"--{k.replace('_', '-')} {_shown(v)}" for k, v in measure.quick.items())
    parser.add_argument(
        "--quick", action="store_true", help=f"a short run: {quick or 'as is'} (options given win)"
    )
    parser.add_argument("--json", type=Path, help="also write the result tables to this file")
    if measure.options is not None:
        measure.options(parser)
    return parser


def _shown(value: Any) -> str:
    return ",".join(value) if isinstance(value, list | tuple) else str(value)


def parse(name: str, measure: Measure, argv: Sequence[str]) -> argparse.Namespace:
    """The options of ``measure``; with ``--quick``, its quick values for those not given.
    ``args.argv`` keeps ``argv`` (for a measure that runs itself in a child process)."""
    parser = parser_for(name, measure)
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**measure.quick)
        args = parser.parse_args(argv)
    args.argv = list(argv)
    return args


def usage() -> str:
    lines = [
        "usage: python -m benchmarks <measure> [options]   (<measure> --help for its own)",
        "       python -m benchmarks all [--quick]   (every measure, one process each)",
        "",
        "measures:",
    ]
    for name in MEASURES:
        summary = (load(name).doc or "").strip().splitlines()[0]
        lines.append(f"  {name:<12} {summary}")
    return "\n".join(lines)


def run_all(argv: Sequence[str]) -> int:
    """Every measure in a process of its own, with ``argv`` (``--quick`` or nothing, the
    one option every measure takes the same way); a failure is reported and the others
    still run."""
    if any(arg != "--quick" for arg in argv):
        print("usage: python -m benchmarks all [--quick]", file=sys.stderr)
        return 2
    failed = []
    for name in MEASURES:
        print(f"\n=== python -m benchmarks {name} {' '.join(argv)}".rstrip(), flush=True)
        if subprocess.run(benchmark_command(name, *argv), check=False).returncode != 0:
            failed.append(name)
    print(
        f"\n{len(MEASURES) - len(failed)} of {len(MEASURES)} measures ran"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def main(argv: Sequence[str]) -> int:
    # A SIGTERM (a timeout, a runner stopping) still runs the clean-up: scratch databases
    # dropped, private servers stopped.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "all":
        return run_all(rest)
    if name not in MEASURES:
        print(f"no measure {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    measure = load(name)
    return measure.run(parse(name, measure, rest))
