"""Create the four role groups (viewer, operator, admin, auditor)."""

from __future__ import annotations

from django.db import migrations

ROLES = ["viewer", "operator", "admin", "auditor"]


def create_groups(apps, schema_editor):  # type: ignore[no-untyped-def]
    db = schema_editor.connection.alias  # the database being migrated, not always default
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.using(db).get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("stack", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]

    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
