"""The authoritative record of every Idempotency-Key."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .store.managers import IdempotencyKeyManager
from .store.outbox import IdempotencyOutboxManager
from .store.status import Status
from .store.suspects import IdempotencySuspectManager


class IdempotencyKey(models.Model):
    Status = Status

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(
        _("scope"), max_length=255, help_text=_("Whose key this is, e.g. user:42.")
    )
    key = models.CharField(_("key"), max_length=255)
    fingerprint = models.CharField(
        _("fingerprint"), max_length=64, help_text=_("SHA-256 of method, path, query and body.")
    )
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    claim_token = models.UUIDField(
        _("claim token"), help_text=_("Fencing token: a fresh UUID per claim.")
    )
    locked_at = models.DateTimeField(
        _("locked at"), null=True, blank=True, help_text=_("Last renewal of the lease.")
    )
    request_method = models.CharField(_("request method"), max_length=16, blank=True)
    request_path = models.TextField(_("request path"), blank=True)
    response_status = models.PositiveSmallIntegerField(_("response status"), null=True, blank=True)
    response_headers = models.JSONField(_("response headers"), default=dict, blank=True)
    response_body = models.BinaryField(_("response body"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    completed_at = models.DateTimeField(_("completed at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"))
    #: The last step of a view declared with ``steps=True`` whose work committed (see
    #: docs/steps.md); null for a view without steps and before its first step.
    # Nullable: the claim's hand-written INSERT does not name it (and NULL is no step yet).
    recovery_point = models.CharField(  # noqa: DJ001
        _("recovery point"),
        max_length=255,
        null=True,
        blank=True,
        help_text=_("The last step that committed, for a view that runs in steps."),
    )
    #: The steps done, in order: ``{"fingerprint": ..., "done": [{"name", "kind",
    #: "result"}, ...]}``; written with ``recovery_point``, fenced by ``claim_token``.
    steps = models.JSONField(
        _("steps"),
        null=True,
        blank=True,
        help_text=_("The steps done and their stored results, in order."),
    )

    objects = IdempotencyKeyManager()

    class Meta:
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="idempotency_scope_key_uniq"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expires_idx")]

    def __str__(self) -> str:
        return f"{self.scope} / {self.key}"

    @property
    def is_expired(self) -> bool:
        """Whether ``expires_at`` has passed by this process's clock: for display. The store,
        the purge and the admin judge expiry on the database's clock
        (``IdempotencyKey.objects.expired()``)."""
        return self.expires_at <= timezone.now()


class IdempotencyOutbox(models.Model):
    """A completed response written by the ``hybrid`` strategy, waiting to be drained.

    The row is inserted in the same transaction as the view's own writes, so it
    exists exactly when they committed. ``IdempotencyOutbox.objects.drain()`` (the
    ``drain_outbox`` Celery task) moves rows into :class:`IdempotencyKey` in
    batches. Until then the row itself answers replays and blocks a second
    commit for the same key through the unique constraint on (scope, key).
    """

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(_("scope"), max_length=255)
    key = models.CharField(_("key"), max_length=255)
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    request_method = models.CharField(_("request method"), max_length=16, blank=True)
    request_path = models.TextField(_("request path"), blank=True)
    response_status = models.PositiveSmallIntegerField(_("response status"))
    response_headers = models.JSONField(_("response headers"), default=dict, blank=True)
    response_body = models.BinaryField(_("response body"), default=b"", blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    expires_at = models.DateTimeField(_("expires at"))

    objects = IdempotencyOutboxManager()

    class Meta:
        verbose_name = _("idempotency outbox row")
        verbose_name_plural = _("idempotency outbox")
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key"], name="idempotency_outbox_scope_key_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} / {self.key} (outbox)"


class IdempotencySuspect(models.Model):
    """A key the ``hybrid`` strategy handled in the database alone, so that Redis has no
    record of it (Redis refused its claim, or its completed record after the commit).

    Until ``expires_at`` (the database's clock: as long as the key's record may live) every
    hybrid process that reads it looks the key up in the database before a claim of it in
    Redis, and whichever process next reaches Redis writes the key's suspect mark there and
    deletes the row. See docs/hybrid.md ("Fallback episodes").
    """

    id = models.BigAutoField(primary_key=True)
    digest = models.CharField(
        _("digest"), max_length=32, unique=True, help_text=_("Names the key in Redis.")
    )
    scope = models.TextField(_("scope"))
    key = models.CharField(_("key"), max_length=255)
    expires_at = models.DateTimeField(_("expires at"))

    objects = IdempotencySuspectManager()

    class Meta:
        verbose_name = _("idempotency suspect")
        verbose_name_plural = _("idempotency suspects")
        indexes = [models.Index(fields=["expires_at"], name="idempotency_suspect_exp_idx")]

    def __str__(self) -> str:
        return f"{self.scope} / {self.key} (suspect)"
