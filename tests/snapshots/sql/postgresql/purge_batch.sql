-- purge_batch (postgresql)
-- parameters: older, lease, older, lease, limit
DELETE
FROM "django_idempotency_idempotencykey"
WHERE "expires_at" <= (statement_timestamp() + make_interval(secs => %s))
AND ("status" <> 'in_progress' OR (("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))
AND "steps" IS NULL))
AND "id" IN (SELECT "id"
FROM "django_idempotency_idempotencykey"
WHERE "expires_at" <= (statement_timestamp() + make_interval(secs => %s))
AND ("status" <> 'in_progress' OR (("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))
AND "steps" IS NULL))
ORDER BY "expires_at" LIMIT %s)
