-- renew (sqlite)
-- parameters: app_now, pk, token
UPDATE "django_idempotency_idempotencykey"
SET "locked_at" = %s
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
