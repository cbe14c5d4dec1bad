"""Removing what a test's Celery traffic left on the shared Redis (DB 15).

Kombu's Redis transport keeps a queue as a list named after it, its bindings under
``_kombu.binding.<queue>`` / ``_kombu.binding_permanent.<queue>``, and messages a
worker received but had not acknowledged (a worker killed with SIGKILL) in the
``unacked`` hash and ``unacked_index`` sorted set, from where it would put them back
on the queue later. Only the entries of the test's own queue are removed.
"""

from __future__ import annotations

import json

import redis

from . import services


def delete_queue(name: str, url: str = services.REDIS_URL) -> None:
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
        for tag, raw in client.hgetall("unacked").items():
            try:
                _message, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if routing_key == name:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    except redis.RedisError:
        pass
    finally:
        client.close()
