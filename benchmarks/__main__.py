"""``python -m benchmarks <measure> [options]``: one measure, or ``all`` of them."""

from __future__ import annotations

import sys

from benchmarks.harness.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
