-- take_over_in_transaction (postgresql)
-- parameters: token, fingerprint, method, path, response_headers, ttl, pk, old_token, stale
UPDATE "django_idempotency_idempotencykey"
SET "recovery_point" = CASE WHEN "status" = 'in_progress' THEN "recovery_point" ELSE NULL END, "steps" = CASE WHEN "status" = 'in_progress' THEN "steps" ELSE NULL END, "created_at" = CASE WHEN "status" = 'in_progress'
AND "steps" IS NOT NULL THEN "created_at" ELSE statement_timestamp() END, "claim_token" = %s, "fingerprint" = %s, "status" = 'in_progress', "locked_at" = statement_timestamp(), "request_method" = %s, "request_path" = %s, "response_status" = NULL, "response_headers" = %s, "response_body" = NULL, "completed_at" = NULL, "expires_at" = (statement_timestamp() + make_interval(secs => %s))
WHERE "id" = %s
AND "claim_token" = %s
AND (("status" = 'completed'
AND "expires_at" <= statement_timestamp()) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= (statement_timestamp() + make_interval(secs => %s)))))
AND NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = "django_idempotency_idempotencykey"."scope"
AND "django_idempotency_idempotencyoutbox"."key" = "django_idempotency_idempotencykey"."key"
AND "django_idempotency_idempotencyoutbox"."expires_at" > statement_timestamp())
