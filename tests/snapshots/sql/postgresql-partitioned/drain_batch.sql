-- drain_batch (postgresql-partitioned)
-- parameters: limit
WITH batch AS MATERIALIZED (SELECT "id", "created_at", "scope", "key"
FROM "django_idempotency_idempotencyoutbox"
ORDER BY "id" LIMIT %s FOR UPDATE SKIP LOCKED), locked AS MATERIALIZED (SELECT "id", pg_advisory_xact_lock(lock)
FROM (SELECT batch."id", hashtextextended('django_idempotency' || chr(31) || "scope" || chr(31) || "key", 0) AS lock
FROM batch
ORDER BY lock OFFSET 0) AS ordered) SELECT (SELECT count(*)
FROM batch), ARRAY(SELECT "id"
FROM locked)
