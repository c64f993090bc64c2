"""Reads of the audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet

from registry.audit.models import AuditEntry


def audit_entries(
    *,
    object_type: str = "",
    object_id: str = "",
    actor: str = "",
    surface: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEntry]:
    """Audit rows, newest first; `object_type` is "app_label.model" (already checked by the form)."""
    rows = AuditEntry.objects.order_by("-timestamp", "-id")
    if object_type:
        app_label, model = object_type.split(".", 1)
        rows = rows.filter(content_type=ContentType.objects.get_by_natural_key(app_label, model))
        if object_id:
            rows = rows.filter(object_pk=object_id)
    if actor:
        rows = rows.filter(actor_label=actor)
    if surface:
        rows = rows.filter(surface=surface)
    if since:
        rows = rows.filter(timestamp__gte=since)
    if until:
        rows = rows.filter(timestamp__lt=until)
    return rows


def audit_entries_from_form(cleaned: dict[str, Any]) -> QuerySet[AuditEntry]:
    return audit_entries(**{k: v for k, v in cleaned.items() if v not in (None, "")})


def object_type_of(entry: AuditEntry) -> str:
    """ "stack.provider": the filter value of an entry's model (content types are cached)."""
    try:
        ct = ContentType.objects.get_for_id(entry.content_type_id)
    except ContentType.DoesNotExist:  # the model was removed; the row stays
        return ""
    return f"{ct.app_label}.{ct.model}"
