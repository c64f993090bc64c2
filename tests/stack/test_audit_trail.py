"""The audit trail (registry.audit): every tracked kind of change leaves a row saying who, when, from
which surface, with the values before and after; secrets never reach it; it cannot be changed."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection, models, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from billing.models import Budget
from inference.models import ChaosConfig
from registry.audit.models import AuditEntry
from registry.audit.origin import Surface, audit_origin
from registry.auth.roles import Role
from registry.crypto import encrypt_secret
from registry.models import ApiToken, Cluster, ImmutableRowError, RoutingPolicyVersion, TeamMembership
from registry.services import api_token_create, provider_set_credentials, workflow_policy_change
from tests.factories import (
    make_cluster,
    make_deployment,
    make_model,
    make_price,
    make_provider,
    make_team,
    make_user,
    make_workflow,
)

pytestmark = pytest.mark.django_db

CREATE, UPDATE = AuditEntry.Action.CREATE, AuditEntry.Action.UPDATE


def rows_for(obj: models.Model) -> list[AuditEntry]:
    ct = ContentType.objects.get_for_model(obj)
    return list(AuditEntry.objects.filter(content_type=ct, object_pk=str(obj.pk)).order_by("id"))


# Each kind: make one, then change one field; (field, before, after) as the trail stores them.
def _policy(user: User) -> tuple[models.Model, Callable[[models.Model], None], tuple[str, Any, Any]]:
    workflow = make_workflow(owner=user)
    deployments = [make_deployment(), make_deployment()]

    def change(_: models.Model) -> None:
        workflow_policy_change(workflow=workflow, deployments=deployments, author=user, reason="swap")

    return workflow.policy_versions.get(), change, ("reason", None, None)


def _set(field: str, value: Any) -> Callable[[models.Model], None]:
    def change(obj: models.Model) -> None:
        setattr(obj, field, value)
        obj.save()

    return change


KINDS: dict[
    str, Callable[[User], tuple[models.Model, Callable[[models.Model], None], tuple[str, Any, Any]]]
] = {
    "provider": lambda u: (
        make_provider(region="eu-west-1"),
        _set("region", "us-east-2"),
        ("region", "eu-west-1", "us-east-2"),
    ),
    "cluster": lambda u: (make_cluster(price=None, capacity=2), _set("capacity", 5), ("capacity", 2, 5)),
    "model": lambda u: (
        make_model(context_length=128),
        _set("context_length", 256),
        ("context_length", 128, 256),
    ),
    "deployment": lambda u: (make_deployment(enabled=True), _set("enabled", False), ("enabled", True, False)),
    "workflow": lambda u: (
        make_workflow(owner=u, team="red", description="old"),
        _set("description", "new"),
        ("description", "old", "new"),
    ),
    "team": lambda u: (
        make_team("audit-red", name="Red"),
        _set("name", "Red team"),
        ("name", "Red", "Red team"),
    ),
    "team membership": lambda u: (
        TeamMembership.objects.create(team=make_team("audit-blue"), user=u, role=Role.VIEWER),
        _set("role", "operator"),
        ("role", "viewer", "operator"),
    ),
    "routing policy version": _policy,
    "api token": lambda u: (
        api_token_create(user=u, name="ci")[0],
        _set("name", "ci-2"),
        ("name", "ci", "ci-2"),
    ),
    "price book": lambda u: (
        make_price(unit_price=Decimal("1.5"), cluster=make_cluster(price=None)),
        _set("note", "renegotiated"),
        ("note", "", "renegotiated"),
    ),
    "budget": lambda u: (
        Budget.objects.create(name="b-kinds", scope="team", team="red", limit_amount=Decimal("10")),
        _set("limit_amount", Decimal("25")),
        ("limit_amount", "10.000000000", "25"),
    ),
    "chaos config": lambda u: (
        ChaosConfig.objects.create(deployment=make_deployment(), error_rate=0.0),
        _set("error_rate", 0.5),
        ("error_rate", 0.0, 0.5),
    ),
    "group": lambda u: (
        Group.objects.create(name="g-kinds"),
        _set("name", "g-kinds-2"),
        ("name", "g-kinds", "g-kinds-2"),
    ),
    "user": lambda u: (
        make_user(username="kinds-user"),
        _set("is_active", False),
        ("is_active", True, False),
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_change_leaves_a_row_with_actor_surface_and_before_after(kind: str) -> None:
    owner = make_user()
    with audit_origin(surface=Surface.COMMAND, label="command:kinds"):
        obj, change, (field, before, after) = KINDS[kind](owner)
        change(obj)
    if isinstance(obj, RoutingPolicyVersion):  # versions are immutable: a change is a new version
        obj = obj.workflow.policy_versions.order_by("-version").first()  # type: ignore[attr-defined]
        rows = rows_for(obj)
        assert [r.action for r in rows] == [CREATE]
        assert rows[0].changes["reason"] == [None, "swap"]
    else:
        rows = rows_for(obj)
        assert [r.action for r in rows] == [CREATE, UPDATE]
        assert rows[1].changes[field] == [before, after]
        assert field in rows[0].changes  # the create row holds the values after
    for row in rows:
        assert (row.actor_label, row.surface) == ("command:kinds", "command")
        assert row.timestamp.tzinfo is not None and row.timestamp.utcoffset() == timezone.timedelta(0)


def test_a_membership_change_is_recorded_on_the_user() -> None:
    user = make_user()
    group = Group.objects.get_or_create(name=Role.OPERATOR.value)[0]
    with audit_origin(surface=Surface.COMMAND, label="command:roles"):
        user.groups.add(group)
        user.groups.remove(group)
    changes = [r.changes["groups"] for r in rows_for(user) if "groups" in (r.changes or {})]
    assert [(c["operation"], c["objects"]) for c in changes] == [
        ("add", ["operator"]),
        ("delete", ["operator"]),
    ]


# --- Surfaces --------------------------------------------------------------------------------


def test_an_api_change_names_the_caller_and_the_api(operator: User) -> None:
    from tests.factories import api_client

    cluster = make_cluster(price=None, capacity=2)
    response = api_client(operator).patch(f"/api/clusters/{cluster.slug}/", {"capacity": 3}, format="json")
    assert response.status_code == 200, response.content
    row = rows_for(cluster)[-1]
    assert (row.actor_label, row.actor_id, row.surface) == (operator.username, operator.pk, "api")
    assert row.changes["capacity"] == [2, 3]


def test_a_page_change_names_the_user_and_the_web(client: Any, viewer: User) -> None:
    client.force_login(viewer)
    response = client.post("/tokens/", {"name": "from-the-page"})
    assert response.status_code in (200, 302)
    token = ApiToken.objects.get(user=viewer, name="from-the-page")
    row = rows_for(token)[0]
    assert (row.actor_label, row.surface, row.action) == (viewer.username, "web", CREATE)


def test_an_admin_change_is_from_the_admin(client: Any) -> None:
    superuser = User.objects.create_superuser("root-audit", "root@example.com", "pw-for-tests-1")
    client.force_login(superuser)
    response = client.post("/admin/auth/group/add/", {"name": "from-admin"})
    assert response.status_code == 302
    row = rows_for(Group.objects.get(name="from-admin"))[0]
    assert (row.actor_label, row.surface) == ("root-audit", "admin")


def test_a_command_change_is_from_that_command() -> None:
    from django.core.management import call_command

    user = make_user(username="cli-owner")
    call_command("apitoken", "create", "--user", "cli-owner", "--name", "cmd")
    row = rows_for(ApiToken.objects.get(user=user, name="cmd"))[0]
    assert (row.actor_label, row.surface) == ("command:apitoken", "command")


def test_a_task_change_is_from_that_task() -> None:
    from registry.tasks import cluster_health_check

    cluster = make_cluster(price=None, status=Cluster.Status.HEALTHY)
    cluster_health_check.apply()
    row = rows_for(cluster)[-1]
    assert (row.actor_label, row.surface) == ("task:stack.cluster_health_check", "task")
    assert row.changes["status"] == ["healthy", "down"]


def test_a_change_during_a_gateway_request_is_from_the_gateway(rf: Any) -> None:
    from registry.audit.middleware import AuditOriginMiddleware

    user = make_user(username="gw-user")
    request = rf.post("/v1/chat/completions")
    request.user = user

    def view(_: Any) -> Any:
        Group.objects.create(name="during-v1")
        return None

    AuditOriginMiddleware(view)(request)
    row = rows_for(Group.objects.get(name="during-v1"))[0]
    assert (row.actor_label, row.surface) == ("gw-user", "gateway")


def test_a_change_with_no_origin_is_from_the_system() -> None:
    group = Group.objects.create(name="no-origin")
    assert (rows_for(group)[0].actor_label, rows_for(group)[0].surface) == ("system", "system")


# --- Secrets ---------------------------------------------------------------------------------


def _whole_trail_as_text() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(a)::text FROM audit_auditentry a")
        return "\n".join(r[0] for r in cursor.fetchall())


def test_secrets_are_recorded_as_changed_never_by_value() -> None:
    provider = make_provider()
    provider_set_credentials(provider=provider, credentials="sk-provider-PLAINTEXT-1")
    encrypted_1 = provider.credentials_encrypted
    provider_set_credentials(provider=provider, credentials="sk-provider-PLAINTEXT-2")
    budget = Budget.objects.create(name="b-secret", scope="team", team="red", limit_amount=Decimal("1"))
    budget.webhook_secret_encrypted = encrypt_secret("whsec-PLAINTEXT")
    budget.save()
    user = make_user(password="pw-PLAINTEXT-1")
    old_hash = user.password
    user.set_password("pw-PLAINTEXT-2")
    user.save()
    token, raw = api_token_create(user=user, name="secret-test")

    trail = _whole_trail_as_text()
    for secret in (
        "sk-provider-PLAINTEXT",
        encrypted_1,
        provider.credentials_encrypted,
        "whsec-PLAINTEXT",
        budget.webhook_secret_encrypted,
        "pw-PLAINTEXT",
        old_hash,
        user.password,
        raw,
        token.key_hash,
    ):
        assert secret not in trail
    assert [r.changes["credentials_encrypted"] for r in rows_for(provider)[1:]] == [
        ["", "[secret]"],
        ["[secret]", "[secret]"],
    ]
    assert rows_for(budget)[-1].changes["webhook_secret_encrypted"] == ["", "[secret]"]
    assert rows_for(user)[-1].changes["password"] == ["[secret]", "[secret]"]
    assert rows_for(token)[0].changes["key_hash"] == ["", "[secret]"]


# --- Append-only -----------------------------------------------------------------------------


def test_the_trail_cannot_be_updated_or_deleted() -> None:
    group = Group.objects.create(name="immutable")
    row = rows_for(group)[0]
    with pytest.raises(ImmutableRowError):
        AuditEntry.objects.filter(pk=row.pk).update(actor_label="someone else")
    with pytest.raises(ImmutableRowError):
        AuditEntry.objects.filter(pk=row.pk).delete()
    with pytest.raises(ImmutableRowError):
        row.save()
    with pytest.raises(ImmutableRowError):
        row.delete()
    for sql in ("UPDATE audit_auditentry SET actor_label = 'x'", "DELETE FROM audit_auditentry"):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql)
    assert AuditEntry.objects.get(pk=row.pk).actor_label == "system"


def test_deleting_a_user_keeps_what_they_did(rf: Any) -> None:
    from registry.audit.middleware import AuditOriginMiddleware

    user = make_user(username="leaver")
    user_id = user.pk
    group = Group.objects.create(name="before-leaving")
    request = rf.post("/groups/")
    request.user = user

    def view(_: Any) -> Any:
        group.name = "renamed"
        group.save()

    AuditOriginMiddleware(view)(request)
    user.delete()  # no cascade and no SET_NULL: the trigger would refuse either
    row = rows_for(group)[-1]
    assert (row.actor_label, row.actor_id, row.surface) == ("leaver", user_id, "web")
    assert row.changes["name"] == ["before-leaving", "renamed"]
