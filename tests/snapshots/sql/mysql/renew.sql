-- renew (mysql)
-- parameters: pk, token
UPDATE `django_idempotency_idempotencykey`
SET `locked_at` = UTC_TIMESTAMP(6)
WHERE `id` = %s
AND `claim_token` = %s
AND `status` = 'in_progress'
