"""The control view with the same work written by hand on the raw drivers (no library code):
the budget's baseline for what the protocol itself costs.

Both take the key from the header, scope it by the authenticated user and fingerprint the
body (SHA-256); a new key is claimed, the view runs, its response is stored; a retry of a
completed key with the same fingerprint gets the stored response in one read:

* ``HandDatabase``: raw psycopg on Django's connection. The claim ``INSERT ... ON CONFLICT DO
  NOTHING RETURNING`` in autocommit; the view in a transaction whose last statement is the
  completion ``UPDATE``; a retry's ``SELECT`` of the stored response.
* ``HandRedis``: redis-py. The claim ``SET NX PX GET`` (a retry's one read), the completion
  ``SET PX``.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpResponse

from .views import OrderList

TABLE = """CREATE TABLE IF NOT EXISTS hand_keys (
    scope text, key text, fingerprint text, status smallint, code integer, body bytea,
    expires timestamptz, PRIMARY KEY (scope, key))"""
CLAIM = (
    "INSERT INTO hand_keys (scope, key, fingerprint, status, expires) "
    "VALUES (%s, %s, %s, 0, now() + interval '1 day') ON CONFLICT DO NOTHING RETURNING 1"
)
READ = "SELECT fingerprint, status, code, body FROM hand_keys WHERE scope = %s AND key = %s"
COMPLETE = "UPDATE hand_keys SET status = 1, code = %s, body = %s WHERE scope = %s AND key = %s"
TTL_MS = 86_400_000


def create_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(TABLE)


def identity(request: Any) -> tuple[str, str, str]:
    """The key, the scope (the authenticated user) and the body's fingerprint."""
    body = request._request.body
    key = request.META["HTTP_IDEMPOTENCY_KEY"]
    return key, str(request.user.pk), hashlib.sha256(body).hexdigest()


def answer(mine: str, fingerprint: str, status: int, code: int, body: bytes) -> HttpResponse:
    if fingerprint != mine:
        return HttpResponse(b'{"title": "mismatch"}', status=422)
    if status != 1:
        return HttpResponse(b'{"title": "in progress"}', status=409)
    return HttpResponse(bytes(body), status=code, content_type="application/json")


class HandDatabase(OrderList):
    def create(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        key, scope, mine = identity(request)
        connection.ensure_connection()
        raw = connection.connection
        with raw.cursor() as cursor:
            if cursor.execute(CLAIM, (scope, key, mine)).fetchone() is None:
                row = cursor.execute(READ, (scope, key)).fetchone()
                return answer(mine, *row)
        with transaction.atomic():
            response = super().create(request, *args, **kwargs)
            response = self.finalize_response(request, response)
            response.render()
            with raw.cursor() as cursor:
                cursor.execute(COMPLETE, (response.status_code, response.content, scope, key))
        return response


@lru_cache(maxsize=1)
def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(settings.IDEMPOTENCY["REDIS_URL"])


class HandRedis(OrderList):
    def create(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        key, scope, mine = identity(request)
        name = f"{settings.IDEMPOTENCY['REDIS_KEY_PREFIX']}:hand:{scope}:{key}"
        claim = json.dumps({"f": mine, "s": 0})
        old = redis_client().set(name, claim, px=TTL_MS, nx=True, get=True)
        if old is not None:
            record = json.loads(old)
            return answer(
                mine, record["f"], record["s"], record.get("c", 0), record.get("b", "").encode()
            )
        response = super().create(request, *args, **kwargs)
        response = self.finalize_response(request, response)
        response.render()
        body = response.content.decode()
        done = {"f": mine, "s": 1, "c": response.status_code, "b": body}
        redis_client().set(name, json.dumps(done), px=TTL_MS)
        return response
