"""The demo stack that `make demo` runs: idempotent, safe to seed twice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction

from billing.budgets import budget_save
from billing.models import Budget, PriceBook, Unit
from billing.services import price_book_publish
from stack.registry.models import Cluster, Deployment, Provider, RegisteredModel, Team, Workflow
from stack.registry.roles import Role
from stack.registry.services import provider_endpoints_allow, team_membership_set, workflow_create

# (provider slug, display name, kind, region)
PROVIDERS = [
    ("onprem", "On-prem lab", Provider.Kind.ON_PREM, "eu-west-lab"),
    ("aws", "AWS", Provider.Kind.AWS, "us-east-1"),
    ("openai", "OpenAI", Provider.Kind.OPENAI_COMPATIBLE, ""),
]
# (cluster slug, provider, region, accelerator, count, memory GB, capacity type, learners, $/accel-hour)
CLUSTERS = [
    ("onprem-a100", "onprem", "eu-west-lab", "A100-80GB", 8, 1024, "on-demand", 2, Decimal("1.100000")),
    ("aws-g5-use1", "aws", "us-east-1", "A10G", 4, 192, "spot", 2, Decimal("0.452500")),
]


# The demo's two teams and a team-scoped operator of each: (team slug, name, user name).
TEAMS = [("support", "Support", "support-op"), ("platform", "Platform", "platform-op")]


@dataclass(frozen=True)
class DemoStack:
    admin: User
    clusters: list[Cluster]
    team_users: list[str]  # user names of the team-scoped demo users (they share one password)


def demo_teams_seed(*, password: str) -> list[str]:
    """The demo's teams, each with an operator who sees only that team (no global role)."""
    User = get_user_model()
    names = []
    for slug, name, username in TEAMS:
        team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name})
        user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@localhost"})
        user.set_password(password)
        user.save()
        team_membership_set(team=team, user=user, role=Role.OPERATOR)
        names.append(username)
    return names


def demo_stack_seed(*, admin_password: str, now: datetime, team_password: str | None = None) -> DemoStack:
    """`team_password`: the password of the team users (the admin's when not given)."""
    User = get_user_model()
    with transaction.atomic():
        team_users = demo_teams_seed(password=team_password or admin_password)
        admin, _ = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True, "email": "admin@localhost"}
        )
        admin.is_staff = admin.is_superuser = True
        admin.set_password(admin_password)
        admin.save()

        providers = {}
        for slug, name, kind, region in PROVIDERS:
            providers[slug], _ = Provider.objects.get_or_create(
                slug=slug, defaults={"display_name": name, "kind": kind, "region": region}
            )
        clusters = []
        for slug, prov, region, accel, count, mem, cap_type, learners, price in CLUSTERS:
            cluster, _ = Cluster.objects.get_or_create(
                slug=slug,
                defaults={
                    "provider": providers[prov],
                    "region": region,
                    "accelerator_type": accel,
                    "accelerator_count": count,
                    "memory_per_node_gb": mem,
                    "capacity_type": cap_type,
                    "capacity": learners,
                },
            )
            if not PriceBook.objects.filter(cluster=cluster, unit=Unit.ACCELERATOR_HOUR).exists():
                price_book_publish(
                    unit=Unit.ACCELERATOR_HOUR,
                    unit_price=price,
                    effective_from=now,
                    cluster=cluster,
                    note="demo price",
                )
            clusters.append(cluster)

        tiny, _ = RegisteredModel.objects.get_or_create(
            slug="gpt-byte-tiny",
            defaults={
                "family": "gpt-byte",
                "parameter_count": 0,
                "tokenizer": "bytes",
                "context_length": 128,
            },
        )
        hosted, _ = RegisteredModel.objects.get_or_create(
            slug="gpt-4o-mini",
            defaults={"family": "gpt-4o", "tokenizer": "o200k_base", "context_length": 128000},
        )
        # The seed acts as the admin: the on-prem provider's endpoint is the loopback model
        # server, which the outbound guard may reach because this provider is marked so.
        provider_endpoints_allow(
            provider=providers["onprem"], urls=["http://127.0.0.1:8100/v1"], private_network=True
        )
        local, _ = Deployment.objects.get_or_create(
            slug="gpt-byte-onprem",
            defaults={
                "model": tiny,
                "provider": providers["onprem"],
                "base_url": "http://127.0.0.1:8100/v1",
                "hosting_cluster": clusters[0],
            },
        )
        remote, _ = Deployment.objects.get_or_create(
            slug="openai-gpt-4o-mini",
            defaults={"model": hosted, "provider": providers["openai"], "provider_model_id": "gpt-4o-mini"},
        )
        for deployment, unit, price in [
            (remote, Unit.INPUT_TOKENS_1M, Decimal("0.150000")),
            (remote, Unit.OUTPUT_TOKENS_1M, Decimal("0.600000")),
        ]:
            if not PriceBook.objects.filter(deployment=deployment, unit=unit).exists():
                price_book_publish(
                    unit=unit, unit_price=price, effective_from=now, deployment=deployment, note="demo price"
                )
        if not Budget.objects.filter(name="aws-monthly").exists():
            budget_save(
                budget=Budget(
                    name="aws-monthly",
                    scope=Budget.Scope.PROVIDER,
                    provider=providers["aws"],
                    period=Budget.Period.MONTHLY,
                    limit_amount=Decimal("50.00"),
                    thresholds=[50, 80, 100],
                    hard_limit=True,
                )
            )
        if not Workflow.objects.filter(slug="support-triage").exists():
            workflow_create(
                slug="support-triage",
                owner=admin,
                team=Team.objects.get_or_create(slug="support", defaults={"name": "Support"})[0],
                description="Classify incoming support tickets.",
                deployments=[remote, local],
            )
        if not Budget.objects.filter(name="support-monthly").exists():
            budget_save(
                budget=Budget(
                    name="support-monthly",
                    scope=Budget.Scope.TEAM,
                    team="support",
                    period=Budget.Period.MONTHLY,
                    limit_amount=Decimal("20.00"),
                    thresholds=[50, 80, 100],
                )
            )
    return DemoStack(admin=admin, clusters=clusters, team_users=team_users)


# The local-model drill: two serve_model replicas of the demo run's model, one per demo cluster.
LOCAL_WORKFLOW = "local-chat"


@dataclass(frozen=True)
class LocalReplica:
    deployment_slug: str
    cluster_slug: str
    port: int


def demo_local_replicas(*, base_port: int) -> list[LocalReplica]:
    """Where the demo serves the trained model: a primary on-prem, a fallback on AWS."""
    return [
        LocalReplica("gpt-byte-local", "onprem-a100", base_port),
        LocalReplica("gpt-byte-local-aws", "aws-g5-use1", base_port + 1),
    ]


def demo_local_workflow_seed(
    *, model: RegisteredModel, replicas: list[LocalReplica], admin: User, now: datetime
) -> Workflow:
    """Deployments of the trained model behind `local-chat`, primary first; idempotent.

    Self-hosted deployments carry zero token prices: their cost is the hosting cluster's
    accelerator-hours (billing.selfhosted), so each token row is priced at 0.
    """
    with transaction.atomic():
        deployments = []
        for replica in replicas:
            cluster = Cluster.objects.get(slug=replica.cluster_slug)
            url = f"http://127.0.0.1:{replica.port}/v1"
            # As the admin: the cluster's provider may send to this loopback replica.
            provider_endpoints_allow(provider=cluster.provider, urls=[url], private_network=True)
            deployment, _ = Deployment.objects.update_or_create(
                slug=replica.deployment_slug,
                defaults={
                    "model": model,
                    "provider": cluster.provider,
                    "provider_model_id": model.slug,
                    "base_url": url,
                    "hosting_cluster": cluster,
                },
            )
            for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
                if not PriceBook.objects.filter(deployment=deployment, unit=unit).exists():
                    price_book_publish(
                        unit=unit,
                        unit_price=Decimal("0"),
                        effective_from=now,
                        deployment=deployment,
                        note="self-hosted: billed as accelerator-hours",
                    )
            deployments.append(deployment)
        workflow = Workflow.objects.filter(slug=LOCAL_WORKFLOW).first()
        if workflow is None:
            workflow = workflow_create(
                slug=LOCAL_WORKFLOW,
                owner=admin,
                team=Team.objects.get_or_create(slug="platform", defaults={"name": "Platform"})[0],
                description="Chat with the model the demo's DiLoCo run trained (served by serve_model).",
                deployments=deployments,
            )
    return workflow
