from django.db import models


class SideEffect(models.Model):
    """One row per execution of a test view's body."""

    label = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
