"""On PostgreSQL, the key table's heap pages keep a fifth of their room free (fillfactor 80).

The completion of a ``db`` claim rewrites the key row with its response and changes no
indexed column, so PostgreSQL can write the new row version on the same heap page, with no
new index entry (a HOT update), provided that page has room for it. Inserts stop filling a
page at 80 %, which leaves the room for the completed versions of the rows just claimed on
it (a completed row with a 300-byte response is about 600 bytes). Existing pages keep their
layout; new ones follow. Nothing changes on other databases.
"""

from django.db import migrations

#: The share of a heap page that inserts fill, in percent (PostgreSQL's default is 100).
FILLFACTOR = 80


def _table(apps, schema_editor):
    model = apps.get_model("django_idempotency", "IdempotencyKey")
    return schema_editor.quote_name(model._meta.db_table)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"ALTER TABLE {_table(apps, schema_editor)} SET (fillfactor = {FILLFACTOR})"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {_table(apps, schema_editor)} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0003_binary_keys_on_mysql"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
