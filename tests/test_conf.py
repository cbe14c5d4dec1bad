"""Lazy, typed settings (django_idempotency.conf)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from pytest_django.fixtures import Settings

from django_idempotency.conf import DEFAULTS, conf
from django_idempotency.errors import ImproperlyConfiguredStrategy, RedisNotConfigured


def test_defaults() -> None:
    with override_settings(IDEMPOTENCY={}):
        assert conf.STRATEGY == "db"
        assert conf.DATABASE == "default"
        assert conf.HEADER == "Idempotency-Key"
        assert frozenset({"POST", "PATCH"}) == conf.METHODS
        assert conf.REQUIRED is False
        assert conf.TTL == 86400.0
        assert conf.LOCK_TIMEOUT == 60.0
        assert conf.HEARTBEAT_INTERVAL == 20.0  # LOCK_TIMEOUT / 3
        assert conf.RETRY_AFTER is None
        assert conf.ATOMIC is True
        assert conf.STORE_SERVER_ERRORS is False
        assert "location" in conf.STORED_HEADERS and "content-type" in conf.STORED_HEADERS
        assert "set-cookie" in conf.NEVER_STORED_HEADERS
        assert "authorization" in conf.NEVER_STORED_HEADERS
        assert conf.MAX_STORED_BODY_SIZE == 1024 * 1024
        assert conf.SCOPE_FUNCTION is None
        assert conf.DOWNSTREAM_KEY_SECRET == settings.SECRET_KEY
        assert conf.REDIS_FAILURE_MODE == "db"
        assert conf.HYBRID_DB_CHECK == "after_loss"
        assert conf.OUTBOX_BATCH_SIZE == 1000


def test_every_default_has_a_typed_property() -> None:
    with override_settings(IDEMPOTENCY={}):
        for name in DEFAULTS:
            getattr(conf, name)


def test_missing_setting_means_defaults() -> None:
    with override_settings():
        del settings.IDEMPOTENCY
        assert not hasattr(settings, "IDEMPOTENCY")
        assert conf.STRATEGY == "db"
        assert conf.user_settings == {}


def test_override_settings_takes_effect_at_once() -> None:
    assert conf.LOCK_TIMEOUT == 60.0
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 9, "METHODS": ["post", "put"]}):
        assert conf.LOCK_TIMEOUT == 9.0
        assert conf.HEARTBEAT_INTERVAL == 3.0
        assert frozenset({"POST", "PUT"}) == conf.METHODS
        with override_settings(IDEMPOTENCY={"HEARTBEAT_INTERVAL": "0.5"}):
            assert conf.LOCK_TIMEOUT == 60.0
            assert conf.HEARTBEAT_INTERVAL == 0.5
    assert conf.LOCK_TIMEOUT == 60.0
    assert frozenset({"POST", "PATCH"}) == conf.METHODS


def test_settings_fixture_changes_take_effect(settings: Settings) -> None:
    settings.IDEMPOTENCY = {"STORED_HEADERS": ["X-Kept"], "DOWNSTREAM_KEY_SECRET": "abc"}
    assert frozenset({"x-kept"}) == conf.STORED_HEADERS
    assert conf.DOWNSTREAM_KEY_SECRET == "abc"


def test_nothing_is_written_into_settings() -> None:
    def snapshot() -> dict[str, object]:
        return {name: getattr(settings, name) for name in dir(settings) if name.isupper()}

    user = {"TTL": 5}
    with override_settings(IDEMPOTENCY=user):
        before = snapshot()
        for name in DEFAULTS:
            getattr(conf, name)
        assert snapshot() == before
        assert settings.IDEMPOTENCY == {"TTL": 5}
        assert user == {"TTL": 5}
        assert conf.user_settings == {"TTL": 5}
    with override_settings():
        del settings.IDEMPOTENCY
        before = snapshot()
        for name in DEFAULTS:
            getattr(conf, name)
        assert snapshot() == before
        assert not hasattr(settings, "IDEMPOTENCY")


@pytest.mark.parametrize("error", [ImproperlyConfiguredStrategy, RedisNotConfigured])
def test_configuration_errors_are_improperly_configured(error: type[Exception]) -> None:
    """A project that catches Django's ``ImproperlyConfigured`` catches the app's too."""
    assert issubclass(error, ImproperlyConfigured)
    with pytest.raises(ImproperlyConfigured):
        raise error("misconfigured")


def test_values_are_cached_until_a_setting_changes() -> None:
    """A value is read once; override_settings (setting_changed) drops it, and so does
    ``strategies.reset()`` after an assignment that sends no signal."""
    from django_idempotency import strategies

    with override_settings(IDEMPOTENCY={"TTL": 10}):
        assert conf.TTL == 10.0
        assert "TTL" in conf.__dict__  # cached on the instance
        with override_settings(IDEMPOTENCY={"TTL": 20}):
            assert conf.TTL == 20.0
        assert conf.TTL == 10.0
        old = settings.IDEMPOTENCY
        try:
            settings.IDEMPOTENCY = {"TTL": 30}  # no setting_changed
            assert conf.TTL == 10.0
            strategies.reset()
            assert conf.TTL == 30.0
        finally:
            settings.IDEMPOTENCY = old
            strategies.reset()


def test_each_setting_is_declared_once_with_all_it_needs() -> None:
    """conf.SETTINGS is the one declaration: the accessors, DEFAULTS and the settings page
    (tests/system/test_docs.py) come from it."""
    from django_idempotency.conf import GROUPS, SETTINGS, IdempotencySettings

    assert list(DEFAULTS) == list(SETTINGS)
    for name, setting in SETTINGS.items():
        assert getattr(IdempotencySettings, name) is setting
        assert setting.group in GROUPS, name
        assert setting.doc and "\n" not in setting.doc, name
        if setting.rule is not None:  # the rule passes the default (None: never checked)
            assert setting.default is None or setting.rule.passes(setting.default), name
