from django.urls import include, path

from example_project.urls import urlpatterns as example_urls

from ..examples import async_views as docs_async
from ..examples import drf_class_view, drf_function_view, drf_viewset, plain_view, receipt_views
from ..examples import middleware_views as docs_middleware
from . import views

urlpatterns = [
    *example_urls,
    path("t/fn/", views.function_view, name="t-fn"),
    path("t/steps/", views.stepped, name="t-steps"),
    path("t/steps/doomed/", views.stepped_doomed, name="t-steps-doomed"),
    path("t/steps/remote-first/", views.remote_first, name="t-steps-remote-first"),
    path("t/steps/drf/", views.SteppedAPIView.as_view(), name="t-steps-drf"),
    path("t/fn-required/", views.function_required, name="t-fn-required"),
    path("t/drf/", views.EchoView.as_view(), name="t-drf"),
    path("t/drf-form/", views.FormView.as_view(), name="t-drf-form"),
    path("t/fn-form/", views.form_function_view, name="t-fn-form"),
    path("t/drf-tenant/", views.TenantView.as_view(), name="t-drf-tenant"),
    path("t/drf-error/", views.ErrorView.as_view(), name="t-drf-error"),
    path("t/drf-anon/", views.AnonymousView.as_view(), name="t-drf-anon"),
    path("t/contended/", views.ContendedView.as_view(), name="t-contended"),
    path("t/drf-guarded/", views.GuardedView.as_view(), name="t-drf-guarded"),
    path("t/drf-narrow/", views.NarrowMethodsView.as_view(), name="t-drf-narrow"),
    path("t/fn-post-only/", views.function_post_only, name="t-fn-post-only"),
    path("t/drf-lost/", views.ConnectionLossView.as_view(), name="t-drf-lost"),
    path("t/fn-lost/", views.function_connection_loss, name="t-fn-lost"),
    path("ex/drf-class/", drf_class_view.ChargeCreateView.as_view(), name="ex-drf-class"),
    path("ex/drf-function/", drf_function_view.create_charge, name="ex-drf-function"),
    path("ex/plain/", plain_view.create_charge, name="ex-plain"),
    path("ex/viewset/", include(drf_viewset.router.urls)),
    path("t/drf-hook/", views.OnCommitView.as_view(), name="t-drf-hook"),
    path("t/fn-hook/", views.on_commit_function, name="t-fn-hook"),
    path("ex/receipt/drf/", receipt_views.ReceiptChargeView.as_view(), name="ex-receipt-drf"),
    path("ex/receipt/fn/", receipt_views.receipt_charge, name="ex-receipt-fn"),
    path("t/async/charge/", docs_async.create_charge, name="t-async-charge"),
    path("t/mw/charge/", docs_middleware.create_charge, name="t-mw-charge"),
    path("t/mw/acharge/", docs_middleware.acreate_charge, name="t-mw-acharge"),
    path("t/mw/webhook/", docs_middleware.provider_webhook, name="t-mw-webhook"),
    path("t/mw/unmarked/", docs_middleware.unmarked, name="t-mw-unmarked"),
]
