-- fence_read (sqlite)
-- parameters: app_now, app_now+stale, scope, key
SELECT "id", "status", "claim_token", (("status" = 'completed'
AND "expires_at" <= %s) OR ("status" = 'in_progress'
AND ("locked_at" IS NULL OR "locked_at" <= %s)))
FROM "django_idempotency_idempotencykey"
WHERE "scope" = %s
AND "key" = %s
