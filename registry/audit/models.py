"""The audit trail's rows: django-auditlog's log entry, append-only, with the surface and actor.

AUDITLOG_LOGENTRY_MODEL points django-auditlog at AuditEntry. The actor and content type keep
their ids but no foreign-key constraint and no cascade: deleting a user (or a stale content
type) must not rewrite or remove the rows that record what they did. `actor_label` keeps the
name after the user is gone.
"""

from __future__ import annotations

from typing import Any, NoReturn

from auditlog.models import AbstractLogEntry, LogEntryManager
from django.conf import settings
from django.db import models

from registry.audit.origin import Surface, current_origin
from registry.models import ImmutableRowError

REFUSED = "the audit trail is append-only"


class AuditEntryQuerySet(models.QuerySet["AuditEntry"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise ImmutableRowError(REFUSED)

    def delete(self) -> NoReturn:  # type: ignore[override]
        raise ImmutableRowError(REFUSED)


class AuditEntryManager(LogEntryManager.from_queryset(AuditEntryQuerySet)):  # type: ignore[misc]
    pass


class AuditEntry(AbstractLogEntry):
    content_type: models.ForeignKey[Any, Any] = models.ForeignKey(
        "contenttypes.ContentType", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    actor: models.ForeignKey[Any, Any] = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    # The user's name, or "command:<name>", "task:<name>", "system".
    actor_label: models.CharField[str, str] = models.CharField(max_length=150, db_index=True)
    surface: models.CharField[str, str] = models.CharField(max_length=16, choices=Surface.choices)

    objects = AuditEntryManager()

    class Meta(AbstractLogEntry.Meta):
        ordering = ["-timestamp", "-id"]
        indexes = [
            # The auditors' filter "this object's history" (registry.audit.selectors).
            models.Index(fields=["content_type", "object_pk", "timestamp"], name="audit_object_time_idx"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRowError(REFUSED)
        if not self.surface:
            self._stamp_origin()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImmutableRowError(REFUSED)

    def _stamp_origin(self) -> None:
        origin = current_origin()
        self.surface = origin.surface
        self.actor_label = origin.label or "anonymous"
        request = origin.request
        user = getattr(request, "user", None) if request is not None else None
        if user is not None and user.is_authenticated:
            self.actor = user
            self.actor_email = user.email or None
            self.actor_label = user.get_username()
        if request is not None and not getattr(self, "remote_addr", None):
            self.remote_addr = request.META.get("REMOTE_ADDR") or None
