"""The examples of the integration pages (docs/drf-class-views.md,
docs/drf-function-views.md, docs/plain-views.md, docs/async.md,
docs/middleware.md), included there as they are here and routed in
tests/testapp/urls.py; docs/api.md's strategy (custom_strategy.py, run by the
fault matrix); docs/testing.md's tests."""
