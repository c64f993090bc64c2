"""Hash-chain the ledger; price books gain effective_to, a source and more units.

Existing usage rows (a development database) are chained in id order. On
PostgreSQL the append-only trigger is switched off for that one backfill.
"""

from __future__ import annotations

from django.db import migrations, models

from billing.chain import CHAINED_FIELDS, GENESIS_HASH, chain_hash

UNITS = [
    ("accelerator_hour", "accelerator-hour"),
    ("input_tokens_1m", "1M input tokens"),
    ("output_tokens_1m", "1M output tokens"),
    ("cached_input_tokens_1m", "1M cached input tokens"),
    ("request", "request"),
    ("storage_gb_month", "GB-month of storage"),
    ("egress_gb", "GB of egress"),
]
TRIGGER = "billing_usage_no_update_delete"


def chain_existing_rows(apps, schema_editor):  # type: ignore[no-untyped-def]
    db = schema_editor.connection.alias  # the database being migrated, not always default
    UsageRecord = apps.get_model("billing", "UsageRecord")
    LedgerHead = apps.get_model("billing", "LedgerHead")
    postgres = schema_editor.connection.vendor == "postgresql"
    if postgres:
        schema_editor.execute(f"ALTER TABLE billing_usagerecord DISABLE TRIGGER {TRIGGER}")
    sequence, prev = 0, GENESIS_HASH
    for row in UsageRecord.objects.using(db).order_by("id").iterator():
        sequence += 1
        row.partition, row.sequence, row.prev_hash = "main", sequence, prev
        row.row_hash = chain_hash({f: getattr(row, f) for f in CHAINED_FIELDS}, prev)
        # The historical model has no append-only guard; this is the one sanctioned rewrite.
        UsageRecord.objects.using(db).filter(pk=row.pk).update(
            partition="main", sequence=sequence, prev_hash=prev, row_hash=row.row_hash
        )
        prev = row.row_hash
    LedgerHead.objects.using(db).update_or_create(
        partition="main", defaults={"last_sequence": sequence, "last_hash": prev}
    )
    if postgres:
        schema_editor.execute(f"ALTER TABLE billing_usagerecord ENABLE TRIGGER {TRIGGER}")


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_usage_ledger_append_only")]

    operations = [
        migrations.CreateModel(
            name="LedgerHead",
            fields=[
                ("partition", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("last_sequence", models.BigIntegerField(default=0)),
                ("last_hash", models.CharField(default="0" * 64, max_length=64)),
            ],
        ),
        migrations.AddField(
            model_name="pricebook", name="effective_to", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="pricebook",
            name="source",
            field=models.CharField(
                choices=[("manual", "Manual"), ("csv", "CSV import"), ("catalog", "Provider catalog file")],
                default="manual",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="pricebook", name="unit", field=models.CharField(choices=UNITS, max_length=32)
        ),
        migrations.AlterField(
            model_name="usagerecord", name="unit", field=models.CharField(choices=UNITS, max_length=32)
        ),
        migrations.AddField(
            model_name="usagerecord", name="partition", field=models.CharField(default="main", max_length=32)
        ),
        migrations.AddField(model_name="usagerecord", name="sequence", field=models.BigIntegerField(null=True)),
        migrations.AddField(
            model_name="usagerecord", name="prev_hash", field=models.CharField(default="", max_length=64)
        ),
        migrations.AddField(
            model_name="usagerecord", name="row_hash", field=models.CharField(default="", max_length=64)
        ),
        migrations.RunPython(chain_existing_rows, migrations.RunPython.noop),
        migrations.AlterField(model_name="usagerecord", name="sequence", field=models.BigIntegerField()),
        migrations.AlterField(model_name="usagerecord", name="prev_hash", field=models.CharField(max_length=64)),
        migrations.AlterField(model_name="usagerecord", name="row_hash", field=models.CharField(max_length=64)),
        migrations.AddConstraint(
            model_name="usagerecord",
            constraint=models.UniqueConstraint(fields=("partition", "sequence"), name="usage_chain_position"),
        ),
    ]
