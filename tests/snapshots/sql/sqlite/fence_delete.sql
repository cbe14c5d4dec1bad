-- fence_delete (sqlite)
-- parameters: pk, token, app_now+stale
DELETE
FROM "django_idempotency_idempotencykey"
WHERE "id" = %s
AND "claim_token" = %s
AND "status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= %s)
