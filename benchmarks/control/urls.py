"""The control project's routes: the plain view, the floors, the view once per strategy, the
same work written by hand on the raw drivers."""

from __future__ import annotations

from django.urls import path

from benchmarks.control.orders.hand import HandDatabase, HandRedis
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
    path("hand-db/orders/", HandDatabase.as_view()),
    path("hand-redis/orders/", HandRedis.as_view()),
    *(
        path(f"{name}/orders/", IdempotentOrderList.as_view(idempotency_strategy=name))
        for name in STRATEGIES
    ),
]
