-- outbox_add_fenced (postgresql)
-- parameters: scope, key, stale, stale, scope, key, scope, key, fingerprint, request_method, request_path, response_status, response_headers, response_body, ttl
WITH fenced AS (DELETE
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
AND "status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))
RETURNING 1), key_row AS (SELECT "status" AS status, (("status" = 'completed'
AND "expires_at" <= statement_timestamp()) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s))))) AS free
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s) INSERT INTO "django_idempotency_idempotencyoutbox" ("scope", "key", "fingerprint", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "expires_at") SELECT %s, %s, %s, %s, %s, %s, %s, %s, statement_timestamp(), (statement_timestamp() + make_interval(secs => %s))
WHERE NOT EXISTS (SELECT 1
FROM key_row
WHERE NOT key_row.free)
AND (NOT EXISTS (SELECT 1
FROM key_row
WHERE key_row.status = 'in_progress') OR EXISTS (SELECT 1
FROM fenced))
ON CONFLICT ("scope", "key") DO UPDATE
SET "fingerprint" = EXCLUDED."fingerprint", "request_method" = EXCLUDED."request_method", "request_path" = EXCLUDED."request_path", "response_status" = EXCLUDED."response_status", "response_headers" = EXCLUDED."response_headers", "response_body" = EXCLUDED."response_body", "created_at" = EXCLUDED."created_at", "expires_at" = EXCLUDED."expires_at"
WHERE "django_idempotency_idempotencyoutbox"."expires_at" <= EXCLUDED."created_at"
RETURNING "id"
