"""/api/chaos/<deployment-slug>/: switch a deployment's fault injection for failover drills.

GET lists every deployment's chaos settings (any role); PUT/PATCH changes one (operators), through
inference.services.chaos_config_set, so the next routed request sees it.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from inference.models import ChaosConfig
from inference.services import chaos_config_set
from stack.registry.models import Deployment


class ChaosSerializer(serializers.Serializer[Any]):
    deployment = serializers.CharField(read_only=True)
    enabled = serializers.BooleanField()
    error_rate = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.0)
    status_codes = serializers.ListField(
        child=serializers.IntegerField(min_value=100, max_value=599), default=list, max_length=10
    )
    latency_ms = serializers.IntegerField(min_value=0, max_value=600_000, default=0)
    malformed_rate = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.0)
    updated_at = serializers.DateTimeField(read_only=True)


def _doc(deployment: Deployment, config: ChaosConfig | None) -> dict[str, Any]:
    return {
        "deployment": deployment.slug,
        "enabled": bool(config and config.enabled),
        "error_rate": config.error_rate if config else 0.0,
        "status_codes": list(config.status_codes) if config else [],
        "latency_ms": config.latency_ms if config else 0,
        "malformed_rate": config.malformed_rate if config else 0.0,
        "updated_at": config.updated_at if config else None,
    }


class ChaosViewSet(viewsets.ViewSet):
    lookup_field = "slug"
    serializer_class = ChaosSerializer

    def list(self, request: Request) -> Response:
        configs = {c.deployment_id: c for c in ChaosConfig.objects.all()}
        docs = [_doc(d, configs.get(d.pk)) for d in Deployment.objects.order_by("slug")]
        return Response(ChaosSerializer(docs, many=True).data)

    def retrieve(self, request: Request, slug: str | None = None) -> Response:
        deployment = get_object_or_404(Deployment, slug=slug)
        config = ChaosConfig.objects.filter(deployment=deployment).first()
        return Response(ChaosSerializer(_doc(deployment, config)).data)

    def update(self, request: Request, slug: str | None = None) -> Response:
        deployment = get_object_or_404(Deployment, slug=slug)
        return _apply(request, deployment, request.data)

    def partial_update(self, request: Request, slug: str | None = None) -> Response:
        """PATCH: PUT over the current settings."""
        deployment = get_object_or_404(Deployment, slug=slug)
        current = _doc(deployment, ChaosConfig.objects.filter(deployment=deployment).first())
        merged = {k: v for k, v in current.items() if k not in ("deployment", "updated_at")}
        merged.update(request.data)
        return _apply(request, deployment, merged)


def _apply(request: Request, deployment: Deployment, raw: Any) -> Response:
    body = ChaosSerializer(data=raw)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    config = chaos_config_set(
        deployment=deployment,
        enabled=data["enabled"],
        user=request.user,  # type: ignore[arg-type]
        error_rate=data["error_rate"],
        status_codes=data["status_codes"],
        latency_ms=data["latency_ms"],
        malformed_rate=data["malformed_rate"],
    )
    return Response(ChaosSerializer(_doc(deployment, config)).data)


def register(router: BaseRouter) -> None:
    router.register("chaos", ChaosViewSet, basename="chaos")
