-- store (postgresql)
-- parameters: scope, key, fingerprint, claim_token, request_method, request_path, response_status, response_headers, response_body, ttl
INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "completed_at", "expires_at")
VALUES (%s, %s, %s, 'completed', %s, NULL, %s, %s, %s, %s, %s, statement_timestamp(), statement_timestamp(), (statement_timestamp() + make_interval(secs => %s)))
ON CONFLICT ("scope", "key") DO UPDATE
SET "fingerprint" = EXCLUDED."fingerprint", "status" = EXCLUDED."status", "claim_token" = EXCLUDED."claim_token", "locked_at" = EXCLUDED."locked_at", "request_method" = EXCLUDED."request_method", "request_path" = EXCLUDED."request_path", "response_status" = EXCLUDED."response_status", "response_headers" = EXCLUDED."response_headers", "response_body" = EXCLUDED."response_body", "created_at" = EXCLUDED."created_at", "completed_at" = EXCLUDED."completed_at", "expires_at" = EXCLUDED."expires_at"
WHERE "django_idempotency_idempotencykey"."expires_at" <= EXCLUDED."created_at"
RETURNING "id"
