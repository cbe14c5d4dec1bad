"""System checks (ids ``django_idempotency.E0xx`` / ``W0xx``; the Redis connection's are in
``strategies.redis.config_checks`` and ``deploy_check``). One module per concern:

* :mod:`.settings`: the validators of ``settings.IDEMPOTENCY`` behind the system check and
  the start-up enforcement (``ensure_valid``), and a view's own options;
* :mod:`.values`: each setting's value on its own, by the rule its declaration in
  ``conf`` gives it, and the settings against each other;
* :mod:`.stores`: the strategy against the keys' database and Redis;
* :mod:`.partitions`: ``PARTITION_INTERVAL``, and the key table it says is partitioned;
* :mod:`.routing`: the database router against the keys' database;
* :mod:`.middleware`: ``IdempotencyMiddleware``'s place in ``MIDDLEWARE``;
* :mod:`.urls`: the views of the URLconf (DRF function views, the middleware's reach).

``apps.IdempotencyConfig.ready()`` imports the modules that register checks.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core.checks import CheckMessage

from ..errors import InvalidConfiguration

ID = "django_idempotency."


def error_text(message: CheckMessage) -> str:
    """``"<id>: <message> HINT: <hint>"``: a check message as ``InvalidConfiguration`` says it."""
    text = f"{message.id}: {message.msg}"
    return f"{text} HINT: {message.hint}" if message.hint else text


def raise_errors(messages: Iterable[CheckMessage]) -> None:
    """Raise ``InvalidConfiguration`` naming every error (not warning) in ``messages``."""
    errors = [error_text(m) for m in messages if m.is_serious()]
    if errors:
        raise InvalidConfiguration("\n".join(errors))
