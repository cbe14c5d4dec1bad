"""The docs' examples import the models of "their own app" (``from .models
import Charge``), as a project's ``payments/views.py`` or ``payments/tests.py``
does: here they are the example project's."""

from example_project.payments.models import Charge

__all__ = ["Charge"]
