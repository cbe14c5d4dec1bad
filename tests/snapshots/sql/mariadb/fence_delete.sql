-- fence_delete (mariadb)
-- parameters: pk, token, stale
DELETE
FROM `django_idempotency_idempotencykey`
WHERE `id` = %s
AND `claim_token` = %s
AND `status` = 'in_progress'
AND (`locked_at` IS NULL OR `locked_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND))
