"""A read-only admin for IdempotencyKey (disable with IDEMPOTENCY['ADMIN_ENABLED'] = False)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .conf import conf
from .models import IdempotencyKey


class IdempotencyKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("key", "scope", "status", "response_status", "created_at", "expires_at")
    list_filter = ("status",)
    search_fields = ("=key", "=scope")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


if conf.ADMIN_ENABLED:
    admin.site.register(IdempotencyKey, IdempotencyKeyAdmin)
