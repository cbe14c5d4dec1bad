-- complete (mysql)
-- parameters: response_status, response_headers, response_body, kept_ttl, ttl, ttl, pk, token
UPDATE `django_idempotency_idempotencykey`
SET `status` = 'completed', `response_status` = %s, `response_headers` = %s, `response_body` = %s, `completed_at` = UTC_TIMESTAMP(6), `locked_at` = NULL, `expires_at` = CASE WHEN `expires_at` >= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
AND `expires_at` <= (UTC_TIMESTAMP(6) + INTERVAL %s SECOND) THEN `expires_at` ELSE (UTC_TIMESTAMP(6) + INTERVAL %s SECOND) END
WHERE `id` = %s
AND `claim_token` = %s
AND `status` = 'in_progress'
