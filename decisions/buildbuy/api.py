"""GET /api/decisions/training-runs/<id>/build-or-buy/: a run's build-or-buy report (JSON).

Team-scoped like the runs themselves (team_field): another team's run answers 404. The report
is money from end to end, so only the roles that may see costs read it (a viewer gets 403).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics
from rest_framework.request import Request
from rest_framework.response import Response

from decisions.buildbuy.selectors import build_or_buy_report
from registry.auth.principal import can_see_costs
from registry.auth.roles import LEDGER_READERS
from training.models import TrainingRun


class BuildOrBuyView(generics.GenericAPIView[TrainingRun]):
    queryset = TrainingRun.objects.select_related("team").order_by("-created_at")
    # The run's team owns its build-or-buy figures, as it owns the run.
    team_field = "team"
    # Every figure is money: read by the ledger readers of the run's team.
    read_roles = LEDGER_READERS

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: int) -> Response:
        run = self.get_object()
        if not can_see_costs(request, run.team_id):
            raise exceptions.PermissionDenied(
                "build-or-buy figures are money: auditors, operators and admins"
            )
        return Response(build_or_buy_report(run=run))

    def get_serializer_class(self) -> Any:  # the answer is the report itself (no serializer)
        return None
