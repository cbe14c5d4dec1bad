-- outbox_add (sqlite)
-- parameters: scope, key, fingerprint, request_method, request_path, response_status, response_headers, response_body, app_now, app_now+ttl
INSERT INTO "django_idempotency_idempotencyoutbox" ("scope", "key", "fingerprint", "request_method", "request_path", "response_status", "response_headers", "response_body", "created_at", "expires_at")
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("scope", "key") DO UPDATE
SET "fingerprint" = EXCLUDED."fingerprint", "request_method" = EXCLUDED."request_method", "request_path" = EXCLUDED."request_path", "response_status" = EXCLUDED."response_status", "response_headers" = EXCLUDED."response_headers", "response_body" = EXCLUDED."response_body", "created_at" = EXCLUDED."created_at", "expires_at" = EXCLUDED."expires_at"
WHERE "django_idempotency_idempotencyoutbox"."expires_at" <= EXCLUDED."created_at"
RETURNING "id"
