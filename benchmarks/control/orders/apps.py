from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "control.orders"
    label = "orders"
