"""The measures, by the name ``python -m benchmarks <name>`` runs them under.

A measure is a module (or a package) of ``benchmarks.measures`` that defines ``MEASURE``, a
``benchmarks.harness.cli.Measure``; adding one is that module plus its line here (see
docs/benchmarks.md, "Adding a measure").
"""

from __future__ import annotations

MEASURES: dict[str, str] = {
    "claim": "benchmarks.measures.claim",
    "redis-claim": "benchmarks.measures.redis_claim",
    "cpu": "benchmarks.measures.cpu",
    "budget": "benchmarks.measures.budget",
    "e2e": "benchmarks.measures.e2e",
    "async-views": "benchmarks.measures.async_views",
    "wait": "benchmarks.measures.wait",
    "wait-poll": "benchmarks.measures.wait_poll",
    "purge": "benchmarks.measures.purge",
    "partitions": "benchmarks.measures.partitions",
    "drain": "benchmarks.measures.drain",
    "capacity": "benchmarks.measures.capacity",
    "hybrid": "benchmarks.measures.hybrid",
    "table": "benchmarks.measures.table",
    "hybrid-claim": "benchmarks.measures.hybrid_claim",
}
