"""django-auditlog's own migrations create its auditlog_logentry table even though
AUDITLOG_LOGENTRY_MODEL points at audit.AuditEntry (they do not mark the model swappable). The
table stays empty, but its foreign keys to auth_user and django_content_type make PostgreSQL
refuse a TRUNCATE of those tables (Django's flush, used by transactional tests, leaves the
swapped-out table out). This drops those foreign keys; nothing reads or writes the table.
"""

from __future__ import annotations

from django.db import migrations

DROP_FOREIGN_KEYS = """
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'auditlog_logentry'::regclass AND contype = 'f'
    LOOP
        EXECUTE format('ALTER TABLE auditlog_logentry DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
"""


def drop_foreign_keys(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_FOREIGN_KEYS, None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_audit_append_only"), ("auditlog", "0017_add_actor_email")]

    operations = [migrations.RunPython(drop_foreign_keys, migrations.RunPython.noop)]
