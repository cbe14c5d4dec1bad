"""The example project's Celery app: ``celery -A example_project.celery worker``.

The broker is ``CELERY_BROKER_URL`` (else ``REDIS_URL``, else a local Redis), read
by the settings; every ``CELERY_*`` Django setting configures the app. The app
finds ``django_idempotency.tasks`` (the outbox drain and the key purge) among
the installed apps. Run a worker and the beat scheduler::

    celery -A example_project.celery worker --loglevel=info
    celery -A example_project.celery beat --loglevel=info
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
