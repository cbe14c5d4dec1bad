-- drain_batch_hold (postgresql-partitioned)
-- parameters: limit, limit, hold
WITH batch AS MATERIALIZED (SELECT "id", "created_at", "scope", "key"
FROM "django_idempotency_idempotencyoutbox"
ORDER BY "id" LIMIT %s FOR UPDATE SKIP LOCKED), due AS (SELECT 1
FROM batch HAVING count(*) >= %s OR min("created_at") <= (statement_timestamp() + make_interval(secs => %s))), locked AS MATERIALIZED (SELECT "id", pg_advisory_xact_lock(lock)
FROM (SELECT batch."id", hashtextextended('django_idempotency' || chr(31) || "scope" || chr(31) || "key", 0) AS lock
FROM batch, due
ORDER BY lock OFFSET 0) AS ordered) SELECT (SELECT count(*)
FROM batch), ARRAY(SELECT "id"
FROM locked)
