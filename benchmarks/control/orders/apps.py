"""The orders app: the one model the control view writes."""

from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "benchmarks.control.orders"
    label = "orders"
