-- complete (mysql)
-- parameters: response_status, response_headers, response_body, ttl, pk, token
UPDATE `django_idempotency_idempotencykey`
SET `status` = 'completed', `response_status` = %s, `response_headers` = %s, `response_body` = %s, `completed_at` = UTC_TIMESTAMP(6), `locked_at` = NULL, `expires_at` = (UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
WHERE `id` = %s
AND `claim_token` = %s
AND `status` = 'in_progress'
