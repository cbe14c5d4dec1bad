-- purge_batch (mariadb)
-- parameters: older, lease, limit
DELETE
FROM `django_idempotency_idempotencykey`
WHERE `expires_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
AND (`status` <> 'in_progress' OR ((`locked_at` IS NULL OR `locked_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND))
AND `steps` IS NULL))
ORDER BY `expires_at` LIMIT %s
