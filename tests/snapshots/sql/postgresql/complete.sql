-- complete (postgresql)
-- parameters: response_status, response_headers, response_body, kept_ttl, ttl, ttl, pk, token
UPDATE "django_idempotency_idempotencykey"
SET "status" = 'completed', "response_status" = %s, "response_headers" = %s, "response_body" = %s, "completed_at" = statement_timestamp(), "locked_at" = NULL, "expires_at" = CASE WHEN "expires_at" >= (statement_timestamp() + make_interval(secs => %s))
AND "expires_at" <= (statement_timestamp() + make_interval(secs => %s)) THEN "expires_at" ELSE (statement_timestamp() + make_interval(secs => %s)) END
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
