import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "django_idempotency"
    verbose_name = _("Idempotency keys")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            middleware,  # noqa: F401  (registers the middleware's checks)
            redis_checks,  # noqa: F401  (registers the checks of the Redis connection)
        )
        from .conf import conf

        # Prometheus metrics only when asked for and installed (check W004 says when
        # they are asked for but prometheus_client is missing).
        if conf.METRICS and importlib.util.find_spec("prometheus_client") is not None:
            from . import metrics

            metrics.install()

        # OpenAPI documentation of the protocol, when drf-spectacular is in use.
        if self.apps is not None and self.apps.is_installed("drf_spectacular"):
            from .contrib import spectacular  # noqa: F401  (registers the view extension)
