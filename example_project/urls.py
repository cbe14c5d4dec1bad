from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from example_project.payments import async_views, views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
    path("api/charges/", views.ChargeView.as_view(), name="charges"),
    path("api/refunds/", views.refund, name="refunds"),
    path("api/stepped/charges/", views.stepped_charge, name="stepped-charges"),
    path("api/async/charges/", async_views.async_charge, name="async-charges"),
    path("api/middleware/charges/", async_views.middleware_charge, name="middleware-charges"),
    path(
        "api/middleware/sync-charges/",
        async_views.middleware_sync_charge,
        name="middleware-sync-charges",
    ),
]

if settings.EXAMPLE_BASELINE_ROUTES:
    from example_project.payments import baseline

    urlpatterns += [
        path("baseline/charges/", baseline.PlainChargeView.as_view(), name="baseline-charges"),
        path("baseline/naive-charges/", baseline.NaiveChargeView.as_view(), name="naive-charges"),
    ]
