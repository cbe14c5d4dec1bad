"""The benchmarks: one harness (``harness/``) and one module per measure (``measures/``).

Run from the checkout: ``python -m benchmarks <measure> [options]``, ``python -m benchmarks
--help`` for the list, ``python -m benchmarks all --quick`` for every measure in its short
mode (what ``make bench`` runs). The method and the conditions are in docs/benchmarks.md.
"""
