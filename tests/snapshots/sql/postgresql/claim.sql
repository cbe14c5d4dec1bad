-- claim (postgresql)
-- parameters: scope, key, fingerprint, status, claim_token, request_method, request_path, response_headers, ttl, scope, key
INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_headers", "created_at", "expires_at") SELECT %s, %s, %s, %s, %s, statement_timestamp(), %s, %s, %s, statement_timestamp(), (statement_timestamp() + make_interval(secs => %s))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = %s
AND "django_idempotency_idempotencyoutbox"."key" = %s
AND "django_idempotency_idempotencyoutbox"."expires_at" > statement_timestamp())
ON CONFLICT ("scope", "key") DO NOTHING
RETURNING "id"
