-- purge_batch_lease_cutoff (sqlite)
-- parameters: app_now+older, lease_cutoff, app_now+older, lease_cutoff, limit
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
