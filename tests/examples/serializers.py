"""``from .serializers import ChargeSerializer`` in the docs' examples: the
example project's (see models.py here)."""

from example_project.payments.serializers import ChargeSerializer

__all__ = ["ChargeSerializer"]
