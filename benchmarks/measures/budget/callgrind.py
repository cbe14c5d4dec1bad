"""Callgrind's side of the budget: the options that file every instruction under a part, and
the reading of its dumps.

Every function but the parts' own (``budget_part_*``) is skipped (``--fn-skip``), so that
the instructions of a skipped function count for the nearest part below it on the stack: a
part's self cost is then what ran while it was the innermost part. Callgrind's patterns know
``*`` and ``?`` only, so "everything but these prefixes" is spelled as the prefixes that
differ from them at some character. The process's first functions (the loader's entry, which
has no symbol and which callgrind names by its address, ``_start``, ``(below main)``) stay
unskipped: callgrind needs an unskipped caller at the bottom of the stack. Other functions
without a symbol (a stripped extension's) are skipped like the rest.
"""

from __future__ import annotations

import re
import string
import struct
import sys
from collections import defaultdict
from pathlib import Path

PART_FUNCTION = "budget_part_"
BOTTOM = ("_start", "(", "_dl", "__libc", "main")


def loader_entry() -> str:
    """Callgrind's name of the dynamic loader's entry point: ``0x`` and its offset in the
    loader's file, in 16 digits (the ELF header's ``e_entry``)."""
    with open(sys.executable, "rb") as binary:
        header = binary.read(64)
        (program_headers,) = struct.unpack_from("<Q", header, 32)
        (size, count) = struct.unpack_from("<HH", header, 54)
        binary.seek(program_headers)
        table = binary.read(size * count)
        for i in range(count):
            kind, _flags, offset, _v, _p, length = struct.unpack_from("<IIQQQQ", table, i * size)
            if kind == 3:  # PT_INTERP
                binary.seek(offset)
                loader = binary.read(length).rstrip(b"\0").decode()
                break
        else:
            return "0x"
    with open(loader, "rb") as elf:
        (entry,) = struct.unpack_from("<Q", elf.read(64), 24)
    return f"0x{entry:016x}"


KEEP = (PART_FUNCTION, *BOTTOM)
ALPHABET = string.ascii_letters + string.digits + "_.$@(<~:-"


def skip_patterns(keep: tuple[str, ...] | None = None) -> list[str]:
    """Patterns matching every name made of ``ALPHABET`` that starts with none of ``keep``."""
    keep = keep if keep is not None else (*KEEP, loader_entry())
    patterns: list[str] = []

    def walk(prefix: str, names: list[str]) -> None:
        following = {name[len(prefix)] for name in names if len(name) > len(prefix)}
        patterns.extend(prefix + c + "*" for c in ALPHABET if c not in following)
        for c in sorted(following):
            under = [name for name in names if name.startswith(prefix + c)]
            if prefix + c not in under:
                walk(prefix + c, under)

    walk("", list(keep))
    return patterns


def options(out: str) -> list[str]:
    return [
        "valgrind", "--tool=callgrind", "--collect-atstart=no",
        f"--callgrind-out-file={out}", *(f"--fn-skip={p}" for p in skip_patterns()),
    ]  # fmt: skip


_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")


def _name(value: str, names: dict[str, str]) -> str:
    match = _NAMED.match(value)
    if match is None:
        return value
    number, name = match.groups()
    if name is not None:
        names[number] = name
    return names.get(number, value)


def read_dump(path: Path) -> tuple[str, int, dict[int, int]]:
    """(the dump's trigger, its total, the instructions filed under each part number).

    A part's count is its self cost plus the inclusive cost of the unskipped functions it
    calls that are not parts and call none (the loader's, ``__libc_*``); -1 holds the rest,
    what no part got (an unskipped function that calls back into a part is counted there)."""
    trigger, total, own, calls = _parse(path)
    through = {caller for (caller, callee) in calls if callee.startswith(PART_FUNCTION)}
    parts: dict[int, int] = defaultdict(int)
    for function, cost in own.items():
        if function.startswith(PART_FUNCTION):
            parts[part_number(function)] += cost
    for (caller, callee), cost in calls.items():
        leaf = not callee.startswith(PART_FUNCTION) and callee not in through
        if caller.startswith(PART_FUNCTION) and leaf:
            parts[part_number(caller)] += cost
    parts[-1] = total - sum(parts.values())
    return trigger, total, dict(parts)


def _parse(path: Path) -> tuple[str, int, dict[str, int], dict[tuple[str, str], int]]:
    """The trigger, the total, each function's self cost, each call's inclusive cost."""
    names: dict[str, str] = {}
    trigger, total = "", 0
    own: dict[str, int] = defaultdict(int)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    function, callee, call_line = "", "", False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("desc: Trigger:"):
            trigger = line.split("Client Request:", 1)[-1].strip()
        elif line.startswith(("totals:", "summary:")):
            total = int(line.split()[1])
        elif line.startswith("fn="):
            function = _name(line[3:], names)
        elif line.startswith("cfn="):
            callee = _name(line[4:], names)
        elif line.startswith("calls="):
            call_line = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            fields = line.split()
            cost = int(fields[1]) if len(fields) > 1 else 0
            if call_line:
                calls[(function, callee)] += cost
            else:
                own[function] += cost
            call_line = False
    return trigger, total, own, calls


def part_number(function: str) -> int:
    """``budget_part_7`` -> 7, ``budget_part_root`` -> 0 (the application's), else -1."""
    if not function.startswith(PART_FUNCTION):
        return -1
    suffix = function[len(PART_FUNCTION) :]
    return int(suffix) if suffix.isdigit() else 0
