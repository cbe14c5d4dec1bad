-- fence_read (mysql)
-- parameters: stale, scope, key
SELECT `id`, `status`, `claim_token`, ((`status` = 'completed'
AND `expires_at` <= UTC_TIMESTAMP(6)) OR (`status` = 'in_progress'
AND (`locked_at` IS NULL OR `locked_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND))))
FROM `django_idempotency_idempotencykey`
WHERE `scope` = %s
AND `key` = %s
