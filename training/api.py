"""Probe jobs API."""

from __future__ import annotations

from typing import Any

from rest_framework import mixins, serializers, viewsets
from rest_framework.routers import BaseRouter

from stack.models import Cluster
from training.models import ProbeJob
from training.services import probe_job_create


class ProbeJobSerializer(serializers.ModelSerializer[ProbeJob]):
    cluster = serializers.SlugRelatedField(slug_field="slug", queryset=Cluster.objects.all())
    created_by = serializers.CharField(source="created_by.get_username", read_only=True, default=None)

    class Meta:
        model = ProbeJob
        fields = [
            "id",
            "cluster",
            "steps",
            "status",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "attempts",
            "worker_hostname",
            "device",
            "loss_curve",
            "final_loss",
            "accelerator_seconds",
            "error",
        ]
        read_only_fields = [f for f in fields if f not in ("cluster", "steps")]

    def create(self, validated_data: dict[str, Any]) -> ProbeJob:
        return probe_job_create(
            cluster=validated_data["cluster"],
            created_by=self.context["request"].user,
            steps=validated_data.get("steps", 300),
        )


class ProbeJobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[ProbeJob]):
    """Short torch jobs dispatched to a cluster's queue."""

    serializer_class = ProbeJobSerializer
    queryset = ProbeJob.objects.select_related("cluster", "created_by")


def register(router: BaseRouter) -> None:
    """Add this app's viewsets to the /api/ router."""
    router.register("probe-jobs", ProbeJobViewSet)
