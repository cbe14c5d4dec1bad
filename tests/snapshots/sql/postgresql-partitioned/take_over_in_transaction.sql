-- take_over_in_transaction (postgresql-partitioned)
-- parameters: lock, pk, old_token, stale, fingerprint, token, method, path, response_headers, ttl
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)); WITH gone AS (DELETE
FROM "django_idempotency_idempotencykey"
WHERE "id" = %s
AND "claim_token" = %s
AND (("status" = 'completed'
AND "expires_at" <= statement_timestamp()) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))))
AND NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = "django_idempotency_idempotencykey"."scope"
AND "django_idempotency_idempotencyoutbox"."key" = "django_idempotency_idempotencykey"."key"
AND "django_idempotency_idempotencyoutbox"."expires_at" > statement_timestamp())
RETURNING "scope", "key", "status", "created_at", "recovery_point", "steps") INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_headers", "created_at", "expires_at", "recovery_point", "steps") SELECT gone."scope", gone."key", %s, 'in_progress', %s, statement_timestamp(), %s, %s, %s, CASE WHEN gone."status" = 'in_progress'
AND gone."steps" IS NOT NULL THEN gone."created_at" ELSE statement_timestamp() END, (statement_timestamp() + make_interval(secs => %s)), CASE WHEN gone."status" = 'in_progress' THEN gone."recovery_point" END, CASE WHEN gone."status" = 'in_progress' THEN gone."steps" END
FROM gone
ON CONFLICT DO NOTHING
RETURNING "id"
