"""django-idempotency: Idempotency-Key handling that runs a side effect once."""

__version__ = "0.1.0.dev0"
