"""The attempt: everything a strategy knows about one request, built by the protocol."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    """Everything a strategy needs to know about one request."""

    scope: str
    key: str
    fingerprint: str
    ttl: float
    lock_timeout: float
    method: str = ""
    path: str = ""
    atomic: bool = True
    database: str = "default"
    #: Seconds a duplicate waits for this key's answer (``WAIT``); 0: the 409 at once.
    #: When > 0 the request that completes or releases the key also wakes its waiters.
    wait: float = 0.0
    #: The key's database when each request chooses one (``DATABASE_ROUTING``), else "".
    shard: str = ""
