-- claim_in_transaction (postgresql-partitioned)
-- parameters: lock, scope, key, fingerprint, status, claim_token, request_method, request_path, response_headers, ttl, scope, key, scope, key
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)); INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_headers", "created_at", "expires_at") SELECT %s, %s, %s, %s, %s, statement_timestamp(), %s, %s, %s, statement_timestamp(), (statement_timestamp() + make_interval(secs => %s))
WHERE NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = %s
AND "django_idempotency_idempotencyoutbox"."key" = %s
AND "django_idempotency_idempotencyoutbox"."expires_at" > statement_timestamp())
AND NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s)
ON CONFLICT DO NOTHING
RETURNING "id"
