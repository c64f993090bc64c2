"""Teams' REST API, on the project's /api/ router (registry.api.viewsets.register mounts it).

- /api/teams/: the caller's teams (every team for a platform-wide role); POST creates one and
  DELETE /api/teams/<slug>/ deletes one (platform admins).
- /api/teams/<slug>/: a team's name and its rpm/tpm limits; PUT/PATCH by platform admins and the
  team's own admins (its slug never changes: the ledger names it).
- /api/teams/<slug>/members/: the members and their roles, for anyone who sees the team; POST
  {user, role} adds a member or changes its role, PATCH/PUT .../members/<username>/ {role}
  changes a role and DELETE .../members/<username>/ removes one (platform admins and the team's
  admins: a team admin manages its own team, never another, and grants team roles only).

Another team answers 404 (registry.auth.teams); the writes are registry.services.teams.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from registry.api.fields import IntegerField, ModelSerializer
from registry.auth.roles import ALL_ROLES, OPERATORS, Role, global_roles
from registry.auth.teams import request_team_admin_of, request_token_team_id
from registry.models import Team, TeamMembership
from registry.services import teams as team_services

_LIMIT = {
    "required": False,
    "allow_null": True,
    "min_value": 0,
    "max_value": team_services.TEAM_RATE_LIMIT_MAX,
}
# Django's user names: letters, digits and @.+-_ (a URL path segment as they are).
USERNAME_PATTERN = r"[\w.@+-]+"


class TeamSerializer(ModelSerializer[Team]):
    slug = serializers.RegexField(
        team_services.TEAM_SLUG_PATTERN,
        max_length=64,
        error_messages={"invalid": f"a team's slug is {team_services.TEAM_SLUG_RULE}"},
        help_text="names the team in the ledger, budgets and URLs; never changes",
    )
    name = serializers.CharField(max_length=team_services.TEAM_NAME_MAX)
    rpm_limit = IntegerField(**_LIMIT, help_text="requests per minute for all the team's keys together")
    tpm_limit = IntegerField(**_LIMIT, help_text="tokens per minute for all the team's keys together")

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "rpm_limit", "tpm_limit", "created_at"]
        read_only_fields = ["id", "created_at"]

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        if self.instance is not None:
            fields["slug"].read_only = True  # the ledger and budgets name the team by it
        return fields


class TeamChangeSerializer(TeamSerializer):
    """A team as PUT and PATCH take it (documentation only: the slug is read-only there)."""

    slug = serializers.RegexField(team_services.TEAM_SLUG_PATTERN, read_only=True)


class MembershipSerializer(ModelSerializer[TeamMembership]):
    user = serializers.SlugRelatedField(
        slug_field="username",
        queryset=User.objects.filter(is_active=True),
        error_messages={"does_not_exist": "no user {value}"},
    )
    role = serializers.ChoiceField(choices=Role.choices, help_text="the role in this team only")

    class Meta:
        model = TeamMembership
        fields = ["user", "role", "source", "created_at"]
        read_only_fields = ["source", "created_at"]


class MembershipRoleSerializer(serializers.Serializer[Any]):
    role = serializers.ChoiceField(choices=Role.choices, help_text="the role in this team only")


_USERNAME = OpenApiParameter("username", str, OpenApiParameter.PATH, description="the member's user name")


class TeamViewSet(viewsets.ModelViewSet[Team]):
    """Teams, their limits and their members."""

    queryset = Team.objects.all()
    serializer_class = TeamSerializer
    lookup_field = "slug"
    lookup_value_regex = "[a-z0-9-]+"  # a slug's characters (team_create checks the rest)
    read_roles = ALL_ROLES
    # Team admins hold the operator role inside their team (registry.auth.teams); who may change
    # what is narrowed below to platform admins and the team's own admins.
    write_roles = OPERATORS
    team_field = "pk"  # a team-scoped caller sees its own teams; another answers 404

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        if self.action == "members":
            return MembershipSerializer
        if self.action == "member":
            return MembershipRoleSerializer
        return TeamSerializer

    # --- Who may manage what ------------------------------------------------------------------

    def _require_platform_admin(self, what: str) -> None:
        if (
            Role.ADMIN not in global_roles(self.request.user)
            or request_token_team_id(self.request) is not None
        ):
            raise exceptions.PermissionDenied(f"Only platform admins {what}")

    def _require_team_admin(self, team: Team) -> None:
        managed = request_team_admin_of(self.request)
        if managed is not None and team.pk not in managed:
            raise exceptions.PermissionDenied(
                f"Only platform admins and admins of team {team.slug} may do this"
            )

    # --- Teams ----------------------------------------------------------------------------

    @extend_schema(request=TeamSerializer, responses={201: TeamSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self._require_platform_admin("create teams")
        body = TeamSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        team = team_services.team_create(**body.validated_data)
        return Response(TeamSerializer(team).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TeamChangeSerializer, responses=TeamSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        team = self.get_object()
        self._require_team_admin(team)
        partial = kwargs.get("partial", False)
        body = TeamSerializer(team, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        team = team_services.team_update(
            team=team,
            name=data.get("name", team.name),
            rpm_limit=data["rpm_limit"] if "rpm_limit" in data else team.rpm_limit,
            tpm_limit=data["tpm_limit"] if "tpm_limit" in data else team.tpm_limit,
            by_platform=request_team_admin_of(request) is None,
        )
        return Response(TeamSerializer(team).data)

    @extend_schema(request=TeamChangeSerializer, responses=TeamSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        team = self.get_object()
        self._require_platform_admin("delete teams")
        team_services.team_delete(team=team)
        return Response(status=status.HTTP_204_NO_CONTENT)

    # --- Members ----------------------------------------------------------------------------

    def _members(self, team: Team) -> QuerySet[TeamMembership]:
        return TeamMembership.objects.filter(team=team).select_related("user").order_by("user__username")

    @extend_schema(methods=["GET"], responses=MembershipSerializer(many=True))
    @extend_schema(methods=["POST"], request=MembershipSerializer, responses={201: MembershipSerializer})
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def members(self, request: Request, slug: str | None = None) -> Response:
        """GET: the team's members and roles. POST {user, role}: add a member (or change its role)."""
        team = self.get_object()
        if request.method == "GET":
            return Response(MembershipSerializer(self._members(team), many=True).data)
        self._require_team_admin(team)
        body = MembershipSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = team_services.team_membership_set(
            team=team, user=body.validated_data["user"], role=body.validated_data["role"]
        )
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        methods=["PUT", "PATCH"],
        parameters=[_USERNAME],
        request=MembershipRoleSerializer,
        responses=MembershipSerializer,
    )
    @extend_schema(methods=["DELETE"], parameters=[_USERNAME], request=None, responses={204: None})
    @action(
        detail=True,
        methods=["put", "patch", "delete"],
        url_path=f"members/(?P<username>{USERNAME_PATTERN})",
        url_name="member",
    )
    def member(self, request: Request, slug: str | None = None, username: str | None = None) -> Response:
        """PUT/PATCH {role}: change a member's role. DELETE: remove the member."""
        team = self.get_object()
        self._require_team_admin(team)
        membership = self._members(team).filter(user__username=username).first()
        if membership is None:
            raise exceptions.NotFound(f"{username} is not a member of team {team.slug}")
        if request.method == "DELETE":
            team_services.team_membership_remove(team=team, user=membership.user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        body = MembershipRoleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = team_services.team_membership_set(
            team=team, user=membership.user, role=body.validated_data["role"]
        )
        return Response(MembershipSerializer(membership).data)
