"""Compiles ``_parts.c`` (once per source and interpreter, in the temporary directory) and
imports it. Needs a C compiler, the interpreter's headers and valgrind's ``callgrind.h``."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("_parts.c")


def build() -> Path:
    """The compiled module's path, compiling it when it is not there yet."""
    text = SOURCE.read_bytes()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256(text + suffix.encode()).hexdigest()[:12]
    where = Path(tempfile.gettempdir()) / f"idem-budget-{tag}"
    target = where / f"_parts{suffix}"
    if target.exists():
        return target
    where.mkdir(exist_ok=True)
    partial = where / f"_parts.{os.getpid()}.tmp"
    command = [
        os.environ.get("CC", "cc"), "-O2", "-fno-optimize-sibling-calls", "-fPIC", "-shared",
        f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(partial),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    partial.replace(target)
    return target


def load() -> ModuleType:
    path = build()
    spec = importlib.util.spec_from_file_location("_parts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
