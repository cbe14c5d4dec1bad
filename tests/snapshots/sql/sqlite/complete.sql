-- complete (sqlite)
-- parameters: response_status, response_headers, response_body, app_now, app_now+kept_ttl, app_now+ttl, app_now+ttl, pk, token
UPDATE "django_idempotency_idempotencykey"
SET "status" = 'completed', "response_status" = %s, "response_headers" = %s, "response_body" = %s, "completed_at" = %s, "locked_at" = NULL, "expires_at" = CASE WHEN "expires_at" >= %s
AND "expires_at" <= %s THEN "expires_at" ELSE %s END
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
