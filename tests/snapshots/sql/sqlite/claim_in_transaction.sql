-- claim_in_transaction (sqlite)
-- parameters: scope, key, fingerprint, status, claim_token, app_now, request_method, request_path, response_headers, app_now, app_now+ttl, scope, key, app_now
INSERT INTO "django_idempotency_idempotencykey" ("scope", "key", "fingerprint", "status", "claim_token", "locked_at", "request_method", "request_path", "response_headers", "created_at", "expires_at") SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s
WHERE NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = %s
AND "django_idempotency_idempotencyoutbox"."key" = %s
AND "django_idempotency_idempotencyoutbox"."expires_at" > %s)
ON CONFLICT ("scope", "key") DO NOTHING
RETURNING "id"
