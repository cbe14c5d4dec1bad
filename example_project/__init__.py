"""The example payments project. Its Celery app is loaded with it, so that tasks
queued from web processes (the hybrid strategy's outbox drain) use its broker;
without Celery installed the project runs without it."""

try:
    from .celery import app as celery_app
except ImportError:  # pragma: no cover - celery is optional
    celery_app = None

__all__ = ["celery_app"]
