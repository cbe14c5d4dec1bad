-- take_over_in_transaction (mysql)
-- parameters: token, fingerprint, method, path, response_headers, ttl, pk, old_token, stale
UPDATE `django_idempotency_idempotencykey`
SET `recovery_point` = CASE WHEN `status` = 'in_progress' THEN `recovery_point` ELSE NULL END, `steps` = CASE WHEN `status` = 'in_progress' THEN `steps` ELSE NULL END, `created_at` = CASE WHEN `status` = 'in_progress'
AND `steps` IS NOT NULL THEN `created_at` ELSE UTC_TIMESTAMP(6) END, `claim_token` = %s, `fingerprint` = %s, `status` = 'in_progress', `locked_at` = UTC_TIMESTAMP(6), `request_method` = %s, `request_path` = %s, `response_status` = NULL, `response_headers` = %s, `response_body` = NULL, `completed_at` = NULL, `expires_at` = (UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
WHERE `id` = %s
AND `claim_token` = %s
AND ((`status` = 'completed'
AND `expires_at` <= UTC_TIMESTAMP(6)) OR (`status` = 'in_progress'
AND (`locked_at` IS NULL OR `locked_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND))))
AND NOT EXISTS (SELECT 1
FROM `django_idempotency_idempotencyoutbox`
WHERE `django_idempotency_idempotencyoutbox`.`scope` = `django_idempotency_idempotencykey`.`scope`
AND `django_idempotency_idempotencyoutbox`.`key` = `django_idempotency_idempotencykey`.`key`
AND `django_idempotency_idempotencyoutbox`.`expires_at` > UTC_TIMESTAMP(6))
