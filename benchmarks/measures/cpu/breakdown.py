"""Where one control route's CPU goes: the worker sampled by py-spy (500 Hz, on-CPU samples),
each sample filed under the innermost frame that names a part of the request."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.control import control_run
from benchmarks.harness.paths import benchmark_command
from benchmarks.harness.report import Column, Table, emit

#: (label, frame names, or "(path/" for a file's frames); a sample counts for the label of
#: its innermost frame that has one, so that the library's own work is split from the
#: database round trips it sends. ``capture`` renders the DRF response, which Django renders
#: later without the mixin (in "the rest").
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "claim statement / Redis script",
        (
            "KeyStatements.claim",
            "RedisStore.claim",
            "AdvisoryLockStrategy.claim",
        ),
    ),
    # The store, and on PostgreSQL the COMMIT it carries with Django's block ended after it.
    ("completion statement / script (+ COMMIT)", ("Lifecycle.complete",)),
    ("Django's COMMIT, after-commit", ("Lifecycle.__exit__",)),
    ("BEGIN, on_commit, settle", ("Lifecycle._settle_and_begin",)),
    ("header, scope, fingerprint", ("IdempotentRequest.from_request", "preload")),
    ("response capture", ("capture",)),
    (
        "events, lease",
        ("IdempotentRequest._keep", "IdempotentRequest._event", "IdempotentRequest._send"),
    ),
    ("the view's handler (serializer, INSERT)", ("CreateModelMixin.create",)),
    ("DRF: authentication, permissions", ("APIView.initial",)),
    ("DRF: request, response, exceptions", ("APIView.dispatch",)),
)
OTHER = "other library code"
REST = "the rest (Django, middleware, test client)"


def part_of(frames: list[str]) -> str | None:
    """The label of the innermost frame that has one; else "other library code" when a
    frame is the library's."""
    for frame in reversed(frames):
        name = frame.split(" (", 1)[0]
        for label, names in PARTS:
            if any(name.endswith(n) for n in names):
                return label
    if any("(django_idempotency/" in frame for frame in frames):
        return OTHER
    return None


def sample(route: str, requests: int, raw: str) -> None:
    """py-spy over a worker running ``route``, its raw samples written to ``raw``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    worker = benchmark_command("cpu", "--worker", "--only", route, "--requests", str(requests))
    command = [spy, "record", "--rate", "500", "--format", "raw", "--output", raw, "--", *worker]
    with control_run() as env:
        subprocess.run(command, env=env, check=True, capture_output=True)


def breakdown(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="idem-spy-") as tmp:
        raw = os.path.join(tmp, "samples.txt")
        sample(args.breakdown, args.requests, raw)
        shares: dict[str, int] = dict.fromkeys([label for label, _ in PARTS] + [OTHER, REST], 0)
        total = 0
        for line in Path(raw).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            if not any(frame.split(" (", 1)[0].endswith(".call") for frame in frames):
                continue  # set-up, not a request
            total += int(count)
            shares[part_of(frames) or REST] += int(count)
    table = Table(
        f"{args.breakdown}: {total} samples in requests",
        [Column("part of the request"), Column("share %", ".1f")],
    )
    for label, samples in shares.items():
        table.add(label, samples / max(total, 1) * 100)
    emit([table], args.json)
    return 0
