"""What the tests share: servers, databases, assertions, request helpers.

* ``services``: where PostgreSQL, Redis and RabbitMQ are, and whether they must be there;
* ``ports``: free loopback ports;
* ``databases``: the PostgreSQL admin connection, scratch databases, one-value queries;
* ``example``: the example project under ``manage.py`` and gunicorn, and racing clients;
* ``redis_servers``: private ``redis-server`` processes and clusters, and broken Redis endpoints;
* ``postgres_servers``: a private PostgreSQL cluster that a test may crash and restart;
* ``redis_fixtures``: the Redis fixtures (a pytest plugin loaded by ``tests/conftest.py``);
* ``commands``: this run's management commands in a subprocess, with their exit status;
* ``workers``: real Celery worker processes, and removing a test's queue from the broker;
* ``task_workers``: the idempotent-task tests' broker, producer and workers (a pytest plugin
  loaded by ``tests/conftest.py``);
* ``kill_points``: a worker that SIGKILLs itself at a step boundary of a charge in steps;
* ``gates``: views whose timing a test controls (``@pytest.mark.urls("tests.support.gates")``);
* ``waiting``: polling until a condition holds;
* ``threads``: threads released together by a barrier, and work in a background thread;
* ``api``: API clients and the requests the strategy tests send;
* ``assertions``: the problem+json checks;
* ``browser``: headless Chromium through Playwright, for the browser tests;
* ``factories``: factory-boy factories of users, keys in each state and outbox rows;
* ``faults``: the fault matrix's views (``@pytest.mark.urls("tests.support.faults")``);

Nothing here imports Django at import time except ``api``, ``assertions``, ``gates``,
``factories`` and ``faults``,
so that the rest works before the settings are configured. (The benchmarks have a harness
of their own, ``benchmarks/harness/``, and do not import this.)
"""
