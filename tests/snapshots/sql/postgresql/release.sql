-- release (postgresql)
-- parameters: pk, token
DELETE
FROM "django_idempotency_idempotencykey"
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
