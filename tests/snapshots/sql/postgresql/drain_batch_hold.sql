-- drain_batch_hold (postgresql)
-- parameters: limit, limit, hold
WITH batch AS MATERIALIZED (SELECT "id", "created_at"
FROM "django_idempotency_idempotencyoutbox"
ORDER BY "id" LIMIT %s FOR UPDATE SKIP LOCKED), due AS (SELECT 1
FROM batch HAVING count(*) >= %s OR min("created_at") <= (statement_timestamp() + make_interval(secs => %s))), moved AS (DELETE
FROM "django_idempotency_idempotencyoutbox" USING batch, due
WHERE "django_idempotency_idempotencyoutbox"."id" = batch."id"
RETURNING "django_idempotency_idempotencyoutbox"."scope", "django_idempotency_idempotencyoutbox"."key", "django_idempotency_idempotencyoutbox"."fingerprint", "django_idempotency_idempotencyoutbox"."request_method", "django_idempotency_idempotencyoutbox"."request_path", "django_idempotency_idempotencyoutbox"."response_status", "django_idempotency_idempotencyoutbox"."response_headers", "django_idempotency_idempotencyoutbox"."response_body", "django_idempotency_idempotencyoutbox"."created_at", "django_idempotency_idempotencyoutbox"."expires_at"), stored AS (INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "completed_at", "expires_at") SELECT "scope", "key", "fingerprint", 'completed', gen_random_uuid(), NULL, "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "created_at", "expires_at"
FROM moved
WHERE "expires_at" > statement_timestamp()
ON CONFLICT ("scope", "key") DO UPDATE
SET "fingerprint" = EXCLUDED."fingerprint", "status" = EXCLUDED."status", "claim_token" = EXCLUDED."claim_token", "locked_at" = EXCLUDED."locked_at", "request_method" = EXCLUDED."request_method", "request_path" = EXCLUDED."request_path", "response_status" = EXCLUDED."response_status", "response_headers" = EXCLUDED."response_headers", "response_body" = EXCLUDED."response_body", "created_at" = EXCLUDED."created_at", "completed_at" = EXCLUDED."completed_at", "expires_at" = EXCLUDED."expires_at"
WHERE "django_idempotency_idempotencykey"."created_at" < EXCLUDED."expires_at"
RETURNING 1) SELECT (SELECT count(*)
FROM batch), (SELECT count(*)
FROM moved), (SELECT count(*)
FROM stored)
