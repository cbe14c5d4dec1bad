"""The recovery point and the steps of a view that runs in steps (docs/steps.md).

Both columns are nullable without a default: the claim's hand-written INSERT names the
columns it sets, and a key of a view without steps never writes them. Adding a nullable
column is a change of the catalogue alone on PostgreSQL, MariaDB, MySQL and SQLite (no
table rewrite)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_idempotency", "0004_key_table_fillfactor")]

    operations = [
        migrations.AddField(
            model_name="idempotencykey",
            name="recovery_point",
            field=models.CharField(
                blank=True,
                help_text="The last step that committed, for a view that runs in steps.",
                max_length=255,
                null=True,
                verbose_name="recovery point",
            ),
        ),
        migrations.AddField(
            model_name="idempotencykey",
            name="steps",
            field=models.JSONField(
                blank=True,
                help_text="The steps done and their stored results, in order.",
                null=True,
                verbose_name="steps",
            ),
        ),
    ]
