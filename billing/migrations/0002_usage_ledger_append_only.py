"""In PostgreSQL, the database itself refuses UPDATE and DELETE on the ledger.

The ORM already refuses (billing.models.AppendOnlyQuerySet); this trigger also
stops raw SQL, a DB console or another service. Corrections are reversal rows.
SQLite (the embedded default) keeps only the ORM guard.
"""

from __future__ import annotations

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION billing_usage_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing_usagerecord is append-only: % refused; write a reversal row', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER billing_usage_no_update_delete
    BEFORE UPDATE OR DELETE ON billing_usagerecord
    FOR EACH ROW EXECUTE FUNCTION billing_usage_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS billing_usage_no_update_delete ON billing_usagerecord;
DROP FUNCTION IF EXISTS billing_usage_append_only();
"""


def _on_postgres(sql: str):  # type: ignore[no-untyped-def]
    def run(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, None)  # None: the % in RAISE is not a placeholder

    return run


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(_on_postgres(CREATE), _on_postgres(DROP))]
