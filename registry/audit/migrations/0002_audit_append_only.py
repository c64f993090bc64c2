"""In PostgreSQL, the database itself refuses UPDATE and DELETE on the audit trail.

The ORM already refuses (registry.audit.models.AuditEntryQuerySet, AuditEntry.save/delete); this
trigger also stops raw SQL, a DB console or another service, as billing's ledger trigger does.
TRUNCATE is left to the table owner (a test database flush). SQLite keeps only the ORM guard.
"""

from __future__ import annotations

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION audit_entry_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditentry is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER audit_entry_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_entry_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_entry_no_update_delete ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_entry_append_only();
"""


def _on_postgres(sql: str):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, None)  # None: the % in RAISE is not a placeholder

    return run


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_audit_entry")]

    operations = [migrations.RunPython(_on_postgres(CREATE), _on_postgres(DROP))]
