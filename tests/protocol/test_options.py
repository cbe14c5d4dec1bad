"""A view's options are declared once (``protocol.options``): every adapter takes the same
names, and a name that is no option is refused where the view is declared."""

from __future__ import annotations

from typing import get_type_hints

import pytest
from django.http import HttpRequest, HttpResponse
from rest_framework.views import APIView

from django_idempotency.decorators import idempotency_opt_in, idempotent
from django_idempotency.drf import idempotent_api_view
from django_idempotency.mixins import IdempotencyMixin
from django_idempotency.protocol.options import OPTION_NAMES, Options, ViewOptions


def test_the_keyword_type_and_the_value_have_the_same_fields() -> None:
    assert tuple(get_type_hints(ViewOptions)) == OPTION_NAMES


def test_methods_are_kept_upper_cased() -> None:
    declared = Options.declared("a view", methods=["post", "Patch"])
    assert declared.methods == frozenset({"POST", "PATCH"})


@pytest.mark.parametrize(
    "decorator", [idempotent, idempotency_opt_in, idempotent_api_view], ids=lambda d: d.__name__
)
def test_a_misspelt_option_is_refused_by_every_decorator(decorator: object) -> None:
    with pytest.raises(TypeError, match=r"unknown idempotency option.*lock_timout"):
        decorator(lock_timout=5)  # type: ignore[operator]


def test_every_option_reaches_the_engine_from_each_adapter() -> None:
    values: ViewOptions = {
        "methods": ["PUT"],
        "required": True,
        "ttl": 60.0,
        "lock_timeout": 9.0,
        "strategy": "db",
        "wait": 1.5,
        "steps": True,
        "completer": True,
    }
    assert set(values) == set(OPTION_NAMES)
    expected = Options(**values)  # type: ignore[arg-type]

    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    # The middleware's views cannot have the completer (tests/test_completer.py): the rest.
    opt_in_values: ViewOptions = {**values, "completer": None}
    opted_in = idempotency_opt_in(**opt_in_values)(view)
    without_completer = Options(**opt_in_values)  # type: ignore[arg-type]
    assert opted_in.idempotency_opt_in.options == without_completer  # type: ignore[attr-defined]

    class MixinView(IdempotencyMixin, APIView):
        pass

    for name, value in values.items():
        setattr(MixinView, "idempotency_" + name, value)
    assert MixinView().get_idempotency_options(HttpRequest()) == expected  # type: ignore[arg-type]

    drf_view = idempotent_api_view(["PUT"], **values)(view)
    assert drf_view.cls().get_idempotency_options(HttpRequest()) == expected


def test_resolve_takes_each_option_left_out_from_its_setting() -> None:
    from django.test import override_settings

    options = Options(lock_timeout=9.0, wait=-1.0)
    with override_settings(IDEMPOTENCY={"TTL": 5, "REQUIRED": True, "WAIT": 2}):
        resolved = options.resolve()
        assert resolved == (frozenset({"POST", "PATCH"}), True, 5.0, 9.0, "db", 0.0)
        assert options.resolve() is resolved  # kept while the settings stay
        with override_settings(IDEMPOTENCY={"METHODS": ["put"], "STRATEGY": "advisory_lock"}):
            assert options.resolve() == (
                frozenset({"PUT"}),
                False,
                86400.0,
                9.0,
                "advisory_lock",
                0.0,
            )
    assert Options(strategy="redis").resolve().strategy == "redis"
