-- fence_read (postgresql)
-- parameters: stale, scope, key
SELECT "id", "status", "claim_token", (("status" = 'completed'
AND "expires_at" <= statement_timestamp()) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))))
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
