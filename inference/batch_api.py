"""/api/batch-jobs/: create (operators), list and detail with progress (any role).

POST {workflow, input_uri} (a key in the object store) or {workflow, input_jsonl} (the JSONL
text, stored for the job); a bad line answers 400 naming the line. POST .../<id>/cancel/ stops
a pending or running job (400 when it has finished). The work is in
inference.batch.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from inference import batch
from inference.batch_selectors import batch_job_progress, batch_jobs
from inference.models import BatchJob
from stack.registry.models import Workflow
from stack.registry.roles import ALL_ROLES, OPERATORS


class BatchJobSerializer(serializers.ModelSerializer[BatchJob]):
    workflow = serializers.SlugRelatedField(slug_field="slug", queryset=Workflow.objects.all())
    input_uri = serializers.CharField(max_length=512, required=False, allow_blank=True, default="")
    input_jsonl = serializers.CharField(required=False, write_only=True, trim_whitespace=False)
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = BatchJob
        fields = [
            "id",
            "workflow",
            "input_uri",
            "input_jsonl",
            "output_uri",
            "state",
            "total",
            "done",
            "failed",
            "cost",
            "progress",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = [f for f in fields if f not in ("workflow", "input_uri", "input_jsonl")]

    def get_progress(self, job: BatchJob) -> dict[str, Any]:
        progress = batch_job_progress(job=job)
        progress["cost"] = str(progress["cost"])
        return progress


class BatchJobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet[BatchJob],
):
    read_roles = ALL_ROLES
    write_roles = OPERATORS
    serializer_class = BatchJobSerializer

    def get_queryset(self) -> Any:
        return batch_jobs(workflow_slug=self.request.query_params.get("workflow"))

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = BatchJobSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        job = batch.batch_job_create(
            workflow=data["workflow"],
            user=request.user,  # type: ignore[arg-type]
            input_uri=data.get("input_uri", ""),
            input_jsonl=data.get("input_jsonl"),
        )
        return Response(BatchJobSerializer(job).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = batch.batch_job_cancel(job=get_object_or_404(BatchJob, pk=pk))
        return Response(BatchJobSerializer(job).data)


def register(router: BaseRouter) -> None:
    router.register("batch-jobs", BatchJobViewSet, basename="batch-job")
