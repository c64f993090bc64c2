"""Price books' API: /api/price-books/, publishing new versions one at a time or from a file."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.models import PriceBook
from billing.price_import import FileImportError, price_import_upload
from billing.services import price_book_publish
from registry.api.fields import DecimalField, ModelSerializer, ResponseSerializer
from registry.auth.roles import ADMINS, LEDGER_READERS
from registry.models import Cluster, Deployment, Provider


class PriceBookSerializer(ModelSerializer[PriceBook]):
    provider = serializers.SlugRelatedField(
        slug_field="slug", queryset=Provider.objects.all(), required=False, allow_null=True
    )
    cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    deployment = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.all(), required=False, allow_null=True
    )
    unit_price = DecimalField(max_digits=24, decimal_places=9, min_value=Decimal("0"))

    class Meta:
        model = PriceBook
        fields = [
            "id",
            "provider",
            "cluster",
            "deployment",
            "unit",
            "unit_price",
            "currency",
            "effective_from",
            "effective_to",
            "source",
            "version",
            "note",
            "created_at",
        ]
        read_only_fields = ["id", "source", "version", "created_at"]
        # A price takes effect when its publisher says, never "now" by omission.
        extra_kwargs = {"effective_from": {"required": True, "allow_null": False}}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        targets = [k for k in ("cluster", "deployment") if attrs.get(k) is not None]
        if len(targets) > 1:
            raise serializers.ValidationError({"cluster": ["price one cluster or one deployment, not both"]})
        if not targets and attrs.get("provider") is None:
            raise serializers.ValidationError({"cluster": ["name a cluster, a deployment or a provider"]})
        start, end = attrs.get("effective_from"), attrs.get("effective_to")
        if start is not None and end is not None and end <= start:
            raise serializers.ValidationError({"effective_to": ["must be after effective_from"]})
        return attrs

    def create(self, validated_data: dict[str, Any]) -> PriceBook:
        return price_book_publish(**validated_data)


class PriceImportRequestSerializer(serializers.Serializer[Any]):
    file = serializers.FileField()
    format = serializers.ChoiceField(choices=["csv", "json"], required=False)


# The schema of import_file's answer (documentation only).
class PriceImportResultSerializer(ResponseSerializer):
    """The price versions an import added, and how many of its rows changed nothing."""

    created = PriceBookSerializer(many=True)
    unchanged = serializers.IntegerField()


class PriceBookViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[PriceBook]):
    """Price versions. A new price supersedes the old one; nothing is edited in place.

    POST import/ adds many versions from a CSV or catalog file.
    """

    serializer_class = PriceBookSerializer
    read_roles = LEDGER_READERS
    write_roles = ADMINS
    shared_with_teams = True  # one price list for every team; platform admins publish it
    queryset = PriceBook.objects.select_related("provider", "cluster", "deployment")

    @extend_schema(
        request={"multipart/form-data": PriceImportRequestSerializer},
        responses={201: PriceImportResultSerializer},
    )
    @action(detail=False, methods=["post"], url_path="import")
    def import_file(self, request: Request) -> Response:
        # POST /api/price-books/import/ (admins): multipart `file` (+ `format`); all rows or none.
        payload = PriceImportRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            result = price_import_upload(
                upload=payload.validated_data["file"], file_format=payload.validated_data.get("format")
            )
        except FileImportError as exc:
            return Response({"errors": [e.as_dict() for e in exc.errors]}, status=status.HTTP_400_BAD_REQUEST)
        serializer = self.get_serializer(result.created, many=True)
        return Response(
            {"created": serializer.data, "unchanged": result.unchanged}, status=status.HTTP_201_CREATED
        )
