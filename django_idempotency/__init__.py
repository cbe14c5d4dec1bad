"""django-idempotency: Idempotency-Key handling that runs a side effect once."""

#: The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0.dev0"
