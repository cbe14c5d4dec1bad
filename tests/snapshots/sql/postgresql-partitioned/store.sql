-- store (postgresql-partitioned)
-- parameters: scope, key, scope, key, fingerprint, claim_token, request_method, request_path, response_status, response_headers, response_body, ttl, scope, key
WITH gone AS (DELETE
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
AND "expires_at" <= statement_timestamp()
RETURNING 1) INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "completed_at", "expires_at") SELECT %s, %s, %s, 'completed', %s, NULL, %s, %s, %s, %s, %s, statement_timestamp(), statement_timestamp(), (statement_timestamp() + make_interval(secs => %s))
WHERE (SELECT count(*)
FROM gone) >= 0
AND NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
AND "expires_at" > statement_timestamp())
ON CONFLICT DO NOTHING
RETURNING "id"
