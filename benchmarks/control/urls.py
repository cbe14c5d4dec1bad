"""The control project's routes: the plain view, the floors, the view once per strategy."""

from __future__ import annotations

from django.urls import path

from benchmarks.control.orders.views import (
    IdempotentOrderList,
    OrderList,
    RoundTripFloor,
    RoundTripFloorSeparateCommit,
)

STRATEGIES = ("db", "advisory_lock", "redis", "hybrid")

urlpatterns = [
    path("plain/orders/", OrderList.as_view()),
    path("floor/orders/", RoundTripFloor.as_view()),
    path("floorcommit/orders/", RoundTripFloorSeparateCommit.as_view()),
    *(
        path(f"{name}/orders/", IdempotentOrderList.as_view(idempotency_strategy=name))
        for name in STRATEGIES
    ),
]
