-- take_over (sqlite)
-- parameters: app_now, token, fingerprint, app_now, method, path, response_headers, app_now+ttl, pk, old_token, app_now, app_now+stale, app_now
UPDATE "django_idempotency_idempotencykey"
SET "recovery_point" = CASE WHEN "status" = 'in_progress' THEN "recovery_point" ELSE NULL END, "steps" = CASE WHEN "status" = 'in_progress' THEN "steps" ELSE NULL END, "created_at" = CASE WHEN "status" = 'in_progress'
AND "steps" IS NOT NULL THEN "created_at" ELSE %s END, "claim_token" = %s, "fingerprint" = %s, "status" = 'in_progress', "locked_at" = %s, "request_method" = %s, "request_path" = %s, "response_status" = NULL, "response_headers" = %s, "response_body" = NULL, "completed_at" = NULL, "expires_at" = %s
WHERE "id" = %s
AND "claim_token" = %s
AND (("status" = 'completed'
AND "expires_at" <= %s) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= %s)))
AND NOT EXISTS (SELECT 1
FROM "django_idempotency_idempotencyoutbox"
WHERE "django_idempotency_idempotencyoutbox"."scope" = "django_idempotency_idempotencykey"."scope"
AND "django_idempotency_idempotencyoutbox"."key" = "django_idempotency_idempotencykey"."key"
AND "django_idempotency_idempotencyoutbox"."expires_at" > %s)
