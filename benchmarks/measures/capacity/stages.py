"""The stages of the capacity measure: the counts, the speed rounds, the drain, the purge."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.harness.postgres import PrivateServer
from benchmarks.harness.rounds import interleave
from benchmarks.measures import drain, purge
from benchmarks.measures import table as key_table

from . import counts, speed

#: (case, phase, figures per key)
Counted = list[tuple[str, str, dict[str, Any]]]


def settings_for(redis_url: str, name: str, db_check: str = "after_loss") -> dict[str, Any]:
    """``IDEMPOTENCY`` for the case ``name``: its own Redis key prefix."""
    return {
        "ADMIN_ENABLED": False,
        "REDIS_URL": redis_url,
        "REDIS_KEY_PREFIX": "cap-" + "".join(c for c in name if c.isalnum() or c == "_"),
        "REDIS_FAILURE_MODE": "fail_closed",  # never measure the db fallback unawares
        "REDIS_SOCKET_TIMEOUT": 2.0,
        "HYBRID_DB_CHECK": db_check,
    }


def use(settings: dict[str, Any], name: str) -> Any:
    """``settings`` in force (the cached clients and settings forgotten); the strategy
    ``name``, warmed up (connections, scripts) and, for hybrid, in its steady state: the
    loss marker older than the TTL, the warm-up's outbox rows drained."""
    from django.conf import settings as django_settings

    from django_idempotency.strategies import load_strategy

    django_settings.IDEMPOTENCY = settings
    if name in ("redis", "hybrid"):
        from django_idempotency.strategies.redis import store

        store.reset_clients()
    else:
        from django_idempotency.conf import conf

        conf.reload()
    strategy = load_strategy(name)
    counts.new_keys(strategy)(3)
    if name == "hybrid":
        from django_idempotency.strategies.redis.store import get_client, get_store

        if settings["HYBRID_DB_CHECK"] == "after_loss":
            aged = counts.age_loss_marker(get_client(), get_store().prefix, counts.TTL)
            print(f"hybrid: loss marker aged past the TTL: {'yes' if aged else 'none found'}")
        counts.new_keys(strategy)(3)
        counts.drained()(counts.outbox_rows())
    return strategy


def count_all(server: PrivateServer, url: str, redis_url: str, args: argparse.Namespace) -> Counted:
    """Every strategy's new key and replay (and hybrid's drain, and its DB-check variant)."""
    n, found = args.requests, []
    counters = counts.Counters(server, url, redis_url)
    try:
        for name in args.strategies:
            strategy = use(settings_for(redis_url, name), name)
            found.append((name, "new key", counts.count(counters, counts.new_keys(strategy), n)))
            if name == "hybrid":
                found.append(
                    ("hybrid drain", "per row", counts.count(counters, counts.drained(), n))
                )
            replay = counts.replays(strategy)
            found.append((name, "replay", counts.count(counters, replay, n)))
            print(f"counted {name}", flush=True)
        if "hybrid" in args.strategies:
            strategy = use(settings_for(redis_url, "hybrid-check", "always"), "hybrid")
            figures = counts.count(counters, counts.new_keys(strategy), n)
            found.append(("hybrid, DB check", "new key", figures))
            counts.drained()(n)
    finally:
        counters.close()
    return found


def speed_rounds(
    url: str, redis_url: str, args: argparse.Namespace
) -> dict[str, list[tuple[float, float]]]:
    """Each strategy and its raw loop, --rounds rounds (rotated) of --requests keys."""
    strategies = {name: use(settings_for(redis_url, "speed"), name) for name in args.strategies}
    loops = speed.loops(strategies, redis_url, url)
    for loop in loops.values():
        loop(20)  # warm-up: connections, prepared scripts
    results = interleave(
        list(loops), args.rounds, lambda name, _r: speed.timed(loops[name], args.requests)
    )
    counts.drained()(counts.outbox_rows())
    return results


def drain_rounds(url: str, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """``python -m benchmarks drain``'s reference and library cases, --rounds rounds."""
    options = argparse.Namespace(rows=args.drain_rows, batch_size=1000, workers=args.drain_workers)
    results = interleave(("reference", "library"), args.rounds,
                         lambda case, r: drain.run_case(url, case, options, r))  # fmt: skip
    if not all(f["ok"] for rounds in results.values() for f in rounds):
        raise RuntimeError("the drain lost or duplicated rows")
    return results


def purge_rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``python -m benchmarks purge``'s fill (--purge-rows expired rows) and statement path
    (batches of 1,000), --rounds times."""
    found = []
    for _ in range(args.rounds):
        purge.fill(args.purge_rows, 0)
        figures = purge.purge("statement", 1000)
        if figures["deleted"] != args.purge_rows:
            raise RuntimeError(f"purged {figures['deleted']} of {args.purge_rows}")
        found.append(figures)
    return found


def storage(rows: int) -> dict[str, float]:
    """Bytes per row of the filled key table: heap, TOAST and each index."""
    table = key_table.table_name()
    heap, total = key_table.sql(
        "SELECT pg_relation_size(%s), pg_total_relation_size(%s)", [table, table]
    )[0]
    indexes = key_table.sql(
        "SELECT indexname, pg_relation_size(indexname::regclass) FROM pg_indexes "
        "WHERE tablename = %s ORDER BY indexname",
        [table],
    )
    found = {"heap": heap / rows}
    found.update({f"index {name}": size / rows for name, size in indexes})
    found["TOAST and maps"] = (total - heap - sum(size for _n, size in indexes)) / rows
    found["total"] = total / rows
    return found
