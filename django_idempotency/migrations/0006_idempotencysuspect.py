"""The keys the hybrid strategy handled in the database alone (docs/hybrid.md, "Fallback
episodes"): a row per key, read by every process, so that a key Redis has no record of is
looked up in the database after the process that handled it ended."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0005_idempotencykey_steps"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdempotencySuspect",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "digest",
                    models.CharField(
                        help_text="Names the key in Redis.",
                        max_length=32,
                        unique=True,
                        verbose_name="digest",
                    ),
                ),
                ("scope", models.TextField(verbose_name="scope")),
                ("key", models.CharField(max_length=255, verbose_name="key")),
                ("expires_at", models.DateTimeField(verbose_name="expires at")),
            ],
            options={
                "verbose_name": "idempotency suspect",
                "verbose_name_plural": "idempotency suspects",
                "indexes": [
                    models.Index(fields=["expires_at"], name="idempotency_suspect_exp_idx")
                ],
            },
        ),
    ]
