"""One viewset for the rows that belong to a workflow and are made by a service (eval sets, batch
jobs, replay studies): list, get and create, scoped through the row's workflow
(registry.auth.scoping): a team member reads its teams' rows (another team's answer 404), a
limited token its workflows', and creating one needs an operator role in the workflow's team."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from registry.auth.roles import ALL_ROLES, OPERATORS

M = TypeVar("M", bound=Model)


@extend_schema_view(
    list=extend_schema(parameters=[OpenApiParameter("workflow", str, description="a workflow's slug")])
)
class WorkflowRowViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet[M],
):
    """A subclass declares `queryset` and `serializer_class`, and creates a row from the
    serializer's validated data in `create_row` (the entity's service); ?workflow=<slug> keeps
    one workflow's rows."""

    read_roles = ALL_ROLES
    write_roles = OPERATORS
    query_params_known: tuple[str, ...] = ("workflow",)
    workflow_field = "workflow"

    def get_queryset(self) -> QuerySet[M]:
        rows = super().get_queryset()
        slug = self.request.query_params.get("workflow")
        return rows.filter(**{f"{self.workflow_field}__slug": slug}) if slug else rows

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        row = self.create_row(dict(body.validated_data))
        return Response(self.get_serializer(row).data, status=status.HTTP_201_CREATED)

    def create_row(self, data: dict[str, Any]) -> M:
        raise NotImplementedError(f"{type(self).__name__} creates its rows through a service")
