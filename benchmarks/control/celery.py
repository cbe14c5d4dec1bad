"""The control project's Celery app, for a worker run by hand
(``celery -A benchmarks.control.celery worker``); the measures load none."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.control.settings")
app = Celery("control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
