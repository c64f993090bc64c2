"""Give the failover events recorded before codes existed a code, read from their free-text reason.

Best effort: the reasons were written by Switchyard's own code, so their shapes are known (cluster
health, a lost learner's reason, a provider call's error, a quality demotion); whatever matches
none of them keeps "other". The rules are frozen here rather than imported, so that later changes
to the writers do not change what this migration did.
"""

from django.db import migrations

BATCH = 1000


def _code(kind: str, reason: str, status: int | None) -> str:
    text = reason.lower()
    if kind == "cluster-health":
        return "heartbeat_timeout" if "heartbeat" in text else "other"
    if "quality demotion" in text:
        return "quality_demotion"
    if "spot interruption" in text or "interrupted: " in text:
        return "preemption"
    if kind == "training":
        if " failed: " in text and "chunk " in text:
            return "chunk_failed"
        if "no report for" in text:
            return "worker_lost"
        if text.endswith(" is down"):
            return "heartbeat_timeout"
        if text.endswith(" is draining"):
            return "cluster_draining"
        if "budget" in text:
            return "budget_exhausted"
        return "other"
    # Inference: "<from> → <to>: <error of the failed call>".
    if "malformed" in text:
        return "malformed_response"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    if "outbound policy" in text or "outside its provider" in text:
        return "endpoint_refused"
    if status is not None:
        if status == 429:
            return "http_429"
        if status == 408:
            return "timeout"
        if status >= 500:
            return "http_5xx"
        if status >= 400:
            return "http_4xx"
    if "cannot reach" in text or "cannot connect" in text or "connection" in text or " broke" in text:
        return "connection_error"
    if "budget" in text:
        return "budget_exhausted"
    return "other"


def forwards(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated, not always default
    FailoverEvent = apps.get_model("stack", "FailoverEvent")
    batch = []
    for event in FailoverEvent.objects.using(db).only("pk", "kind", "reason", "status_code").iterator(chunk_size=BATCH):
        event.code = _code(event.kind, event.reason, event.status_code)
        if event.code != "other":
            batch.append(event)
        if len(batch) >= BATCH:
            FailoverEvent.objects.using(db).bulk_update(batch, ["code"])
            batch = []
    if batch:
        FailoverEvent.objects.using(db).bulk_update(batch, ["code"])


class Migration(migrations.Migration):
    dependencies = [("stack", "0011_failover_code")]

    # Backwards: the column goes with 0011's reversal; nothing to undo here.
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
