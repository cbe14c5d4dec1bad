-- drain_move (postgresql-partitioned)
-- parameters: ids
WITH moved AS (DELETE
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."id" = ANY(%s)
RETURNING "django_idempotency_idempotencyoutbox"."scope", "django_idempotency_idempotencyoutbox"."key", "django_idempotency_idempotencyoutbox"."fingerprint", "django_idempotency_idempotencyoutbox"."request_method", "django_idempotency_idempotencyoutbox"."request_path", "django_idempotency_idempotencyoutbox"."response_status", "django_idempotency_idempotencyoutbox"."response_headers", "django_idempotency_idempotencyoutbox"."response_body", "django_idempotency_idempotencyoutbox"."created_at", "django_idempotency_idempotencyoutbox"."expires_at"), gone AS (DELETE
FROM "django_idempotency_idempotencykey" USING moved
WHERE "django_idempotency_idempotencykey"."scope" = moved."scope"
AND "django_idempotency_idempotencykey"."key" = moved."key"
AND moved."expires_at" > statement_timestamp()
RETURNING 1), stored AS (INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "completed_at", "expires_at") SELECT "scope", "key", "fingerprint", 'completed', gen_random_uuid(), NULL, "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "created_at", "expires_at"
FROM moved
WHERE "expires_at" > statement_timestamp()
AND (SELECT count(*)
FROM gone) >= 0
RETURNING 1) SELECT (SELECT count(*)
FROM moved), (SELECT count(*)
FROM stored)
