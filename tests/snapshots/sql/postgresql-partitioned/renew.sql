-- renew (postgresql-partitioned)
-- parameters: lease, pk, token
UPDATE "django_idempotency_idempotencykey"
SET "locked_at" = statement_timestamp(), "expires_at" = GREATEST("expires_at", (statement_timestamp() + make_interval(secs => %s)))
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
