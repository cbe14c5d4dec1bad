-- renew (postgresql)
-- parameters: pk, token
UPDATE "django_idempotency_idempotencykey"
SET "locked_at" = statement_timestamp()
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
