-- purge_batch (sqlite)
-- parameters: app_now+older, app_now+lease, app_now+older, app_now+lease, limit
DELETE
FROM "django_idempotency_idempotencykey"
WHERE "expires_at" <= %s
AND ("status" <> 'in_progress' OR (("locked_at" IS NULL OR "locked_at" <= %s)
AND "steps" IS NULL))
AND "id" IN (SELECT "id"
FROM "django_idempotency_idempotencykey"
WHERE "expires_at" <= %s
AND ("status" <> 'in_progress' OR (("locked_at" IS NULL OR "locked_at" <= %s)
AND "steps" IS NULL))
ORDER BY "expires_at" LIMIT %s)
