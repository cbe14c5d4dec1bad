-- claim_read (postgresql)
-- parameters: scope, key, stale, fingerprint, scope, key
SELECT 0, "django_idempotency_idempotencyoutbox"."id", "django_idempotency_idempotencyoutbox"."fingerprint", 'completed', NULL, NULL, "django_idempotency_idempotencyoutbox"."expires_at", "django_idempotency_idempotencyoutbox"."response_status", "django_idempotency_idempotencyoutbox"."response_headers", "django_idempotency_idempotencyoutbox"."response_body", FALSE
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = %s
AND "django_idempotency_idempotencyoutbox"."key" = %s
AND "django_idempotency_idempotencyoutbox"."expires_at" > statement_timestamp()
UNION ALL SELECT 1, "id", "fingerprint", "status", "claim_token", "locked_at", "expires_at", "response_status", "response_headers", "response_body", (("status" = 'completed'
AND "expires_at" <= statement_timestamp()) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))
AND ("steps" IS NULL OR "fingerprint" = %s)))
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
ORDER BY 1 LIMIT 1
