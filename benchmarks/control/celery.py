"""The control project's Celery app (the hybrid route queues its outbox drain)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "control.settings")
app = Celery("control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
