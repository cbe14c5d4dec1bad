"""The key table and the outbox in SQL: the managers of ``IdempotencyKey`` and
``IdempotencyOutbox``, their statements, the purge and the drain. The ``db``,
``advisory_lock`` and ``hybrid`` strategies keep their records here."""
