"""The app's configuration: its name in the admin, the system checks it registers, and the
settings it validates when each process starts."""

from __future__ import annotations

import importlib.util
import sys

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

# The validators of the settings and of the views' options, handed over to ``conf`` before
# any view module can be imported (Django imports this module before any app's models).
from .checks import settings as _settings_checks  # noqa: F401


class IdempotencyConfig(AppConfig):
    name = "django_idempotency"
    # Not the model's plural: the admin's breadcrumb reads "Idempotency > Idempotency keys".
    verbose_name = _("Idempotency")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The modules that register system checks.
        from .checks import routing, urls  # noqa: F401
        from .conf import conf
        from .strategies.redis import deploy_check  # noqa: F401

        # A setting the checks call an error stops every process here (gunicorn, uvicorn,
        # Celery and manage.py all call django.setup()), with the checks' messages; only
        # `manage.py check` goes on, to list them in Django's format and exit non-zero.
        if not running_check_command():
            conf.ensure_valid()

        # Prometheus metrics only when asked for and installed (check W004 says when
        # they are asked for but prometheus_client is missing).
        if conf.METRICS and importlib.util.find_spec("prometheus_client") is not None:
            from . import metrics

            metrics.install()

        # Under `manage.py test` each TestCase's Redis records get a prefix of their own
        # (without redis-py installed there are none).
        if importlib.util.find_spec("redis") is not None:
            from .testing import testcases

            if testcases.running_tests():
                testcases.install()

        # OpenAPI documentation of the protocol, when drf-spectacular is in use.
        if self.apps is not None and self.apps.is_installed("drf_spectacular"):
            from .contrib import spectacular  # noqa: F401  (registers the view extension)


def running_check_command() -> bool:
    """Whether this ``django.setup()`` is the one of ``manage.py check`` (or
    ``django-admin check``): Django's ``ManagementUtility.execute()`` is on the stack with
    the subcommand ``check``. That command runs the system checks itself, which report
    every error and exit non-zero, and runs nothing else."""
    from django.core.management import ManagementUtility

    code = ManagementUtility.execute.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_locals.get("subcommand") == "check"
        frame = frame.f_back  # type: ignore[assignment]
    return False
