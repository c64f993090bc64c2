from __future__ import annotations

from django.contrib import admin

from training.models import ProbeJob


@admin.register(ProbeJob)
class ProbeJobAdmin(admin.ModelAdmin[ProbeJob]):
    list_display = ["pk", "cluster", "status", "steps", "final_loss", "accelerator_seconds", "created_at"]
    list_filter = ["status", "cluster"]
    readonly_fields = ["loss_curve", "attempts", "worker_hostname", "accelerator_seconds"]
