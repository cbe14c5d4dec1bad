"""On MySQL and MariaDB, scope and key compare byte for byte: a binary, no-pad collation.

Their default collations compare case-insensitively ('Pay-1' = 'pay-1') and, with PAD
SPACE, ignore trailing spaces, so two different keys (or the scopes of two users whose
names differ in case) would share one row and one stored response. Nothing changes on
other databases, whose comparisons are exact already.
"""

from django.db import migrations

#: The columns of each table that name a key, and the unique constraint over them.
COLUMNS = ("scope", "key")
MODELS = ("IdempotencyKey", "IdempotencyOutbox")


def binary_collation(connection):
    """MariaDB's binary no-pad collation, or MySQL 8's (utf8mb4_bin pads on both)."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def _modify(apps, schema_editor, collation):
    q = schema_editor.quote_name
    for model_name in MODELS:
        model = apps.get_model("django_idempotency", model_name)
        changes = []
        for name in COLUMNS:
            field = model._meta.get_field(name)
            charset = f" CHARACTER SET utf8mb4 COLLATE {collation}" if collation else ""
            changes.append(
                f"MODIFY {q(field.column)} varchar({field.max_length}){charset} NOT NULL"
            )
        schema_editor.execute(f"ALTER TABLE {q(model._meta.db_table)} {', '.join(changes)}")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        _modify(apps, schema_editor, binary_collation(schema_editor.connection))


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        _modify(apps, schema_editor, None)  # the table's default collation again


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0002_idempotencyoutbox"),
    ]

    # DDL on MySQL and MariaDB commits by itself: no transaction around it.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
