-- claim (mysql)
-- parameters: scope, key, fingerprint, status, claim_token, request_method, request_path, response_headers, ttl, scope, key
INSERT INTO `django_idempotency_idempotencykey` (`scope`, `key`, `fingerprint`, `status`, `claim_token`, `locked_at`, `request_method`, `request_path`, `response_headers`, `created_at`, `expires_at`) SELECT %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), %s, %s, %s, UTC_TIMESTAMP(6), (UTC_TIMESTAMP(6) + INTERVAL %s SECOND)
FROM DUAL
WHERE NOT EXISTS (SELECT 1
FROM `django_idempotency_idempotencyoutbox`
WHERE `django_idempotency_idempotencyoutbox`.`scope` = %s
AND `django_idempotency_idempotencyoutbox`.`key` = %s
AND `django_idempotency_idempotencyoutbox`.`expires_at` > UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE `id` = `id`
