"""The demo stack that `make demo` runs: idempotent, safe to seed twice."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction

from billing.budgets import budget_save
from billing.models import Budget, PriceBook, Unit
from billing.services import price_book_publish
from inference.quality.services import eval_set_create
from registry.auth.roles import Role
from registry.models import Cluster, Deployment, Provider, RegisteredModel, Team, Workflow
from registry.services import (
    provider_endpoints_allow,
    team_membership_set,
    workflow_create,
    workflow_retention_set,
)
from stack.demo.providers import demo_ticket, ticket_prompt

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


@dataclass(frozen=True)
class DemoScale:
    """How much work each stage of `manage.py demo` does; `--quick` picks QUICK_SCALE.

    Every stage runs at either scale (probes, the DiLoCo run with its scored versions, the
    ticket traffic and its replay, serving and the chaos drill); the quick one only does less
    of each, so a test can run the demo end to end (tests/integration/test_demo_e2e.py).
    """

    probe_steps: int  # inner steps of each cluster's probe job
    run: dict[str, Any]  # overrides of training.run_config.demo_config()
    register_every_versions: int  # the run's versions scored for build or buy, every k-th
    ticket_requests: int  # tickets sent through /v1 to ticket-labels, then replayed
    drill_requests: int  # chat requests of the chaos drill through local-chat


FULL_SCALE = DemoScale(
    probe_steps=300,
    run={},
    # 3 scored versions and the final one over the demo run's 150 outer steps.
    register_every_versions=50,
    ticket_requests=100,
    drill_requests=24,
)
# About a tenth of each stage. 16 drill requests against a primary failing half its calls
# leave a run of 16 answers without one failover at 1 in 65536.
QUICK_SCALE = DemoScale(
    probe_steps=30,
    run={
        "h": 10,
        "stop": {"outer_steps": 20},
        "data": {"max_train_bytes": 200_000, "max_eval_bytes": 20_000},
        "eval_windows": 16,
    },
    register_every_versions=10,
    ticket_requests=20,
    drill_requests=16,
)


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
    """Where the demo serves the trained model: a primary on-prem, a fallback on AWS.

    Each replica asks for its port beside the demo's (--port + 100, + 101); one that something
    else holds by then (another program, or an outgoing connection's ephemeral port) is swapped
    for a free one the system picks, so the serving stage never stalls on a busy port."""
    return [
        LocalReplica("gpt-byte-local", "onprem-a100", loopback_port(base_port)),
        LocalReplica("gpt-byte-local-aws", "aws-g5-use1", loopback_port(base_port + 1)),
    ]


def loopback_port(preferred: int) -> int:
    """`preferred` if nothing listens or is bound there on 127.0.0.1, else a free port the system
    picks. The caller's child binds it a moment later: a port taken in between fails that child,
    which says so in its log."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise OSError("no free loopback port")


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


# The cost-quality part of the demo (stack.demo.providers): a ticket-labelling workflow served by
# two loopback "API" deployments, graded by a third; it keeps its prompts (opt-in) for replays.
TICKET_WORKFLOW = "ticket-labels"
TICKET_EVAL_SET = "labels-v1"
TICKET_EVAL_CASES = 20


@dataclass(frozen=True)
class TicketProvider:
    deployment_slug: str
    error_share: float
    input_price: Decimal  # per 1M input tokens
    output_price: Decimal  # per 1M output tokens
    port: int


def demo_ticket_providers(*, base_port: int) -> list[TicketProvider]:
    """The large (primary), small and grader deployments, each on its own loopback port."""
    return [
        TicketProvider("acme-large", 0.04, Decimal("3.000000"), Decimal("12.000000"), base_port),
        TicketProvider("acme-small", 0.06, Decimal("0.400000"), Decimal("1.600000"), base_port + 1),
        TicketProvider("acme-grader", 0.0, Decimal("1.000000"), Decimal("4.000000"), base_port + 2),
    ]


def demo_ticket_workflow_seed(*, providers: list[TicketProvider], admin: User, now: datetime) -> Workflow:
    """The acme provider, its three deployments with prices, and `ticket-labels` (team platform,
    like the demo's run, which scores its model on it; prompts kept 14 days; large then small,
    quality floor 0.8) with an eval set; idempotent."""
    with transaction.atomic():
        acme, _ = Provider.objects.get_or_create(
            slug="acme",
            defaults={"display_name": "Acme AI (demo, loopback)", "kind": Provider.Kind.OPENAI_COMPATIBLE},
        )
        urls = [f"http://127.0.0.1:{p.port}/v1" for p in providers]
        provider_endpoints_allow(provider=acme, urls=urls, private_network=True)
        deployments = {}
        for p, url in zip(providers, urls, strict=True):
            model, _ = RegisteredModel.objects.get_or_create(
                slug=p.deployment_slug,
                defaults={"family": "acme", "tokenizer": "cl100k_base", "context_length": 8192},
            )
            deployment, _ = Deployment.objects.update_or_create(
                slug=p.deployment_slug,
                defaults={
                    "model": model,
                    "provider": acme,
                    "provider_model_id": p.deployment_slug,
                    "base_url": url,
                },
            )
            for unit, price in (
                (Unit.INPUT_TOKENS_1M, p.input_price),
                (Unit.OUTPUT_TOKENS_1M, p.output_price),
            ):
                if not PriceBook.objects.filter(deployment=deployment, unit=unit).exists():
                    price_book_publish(
                        unit=unit,
                        unit_price=price,
                        effective_from=now,
                        deployment=deployment,
                        note="demo price",
                    )
            deployments[p.deployment_slug] = deployment
        workflow = Workflow.objects.filter(slug=TICKET_WORKFLOW).first()
        if workflow is None:
            workflow = workflow_create(
                slug=TICKET_WORKFLOW,
                owner=admin,
                team=Team.objects.get_or_create(slug="platform", defaults={"name": "Platform"})[0],
                description="Label support tickets (billing, login, shipping, refund, bug).",
                deployments=[deployments["acme-large"], deployments["acme-small"]],
                quality_floor=Decimal("0.8"),
            )
        if not workflow.retain_prompts:
            workflow_retention_set(workflow=workflow, retain_prompts=True, prompt_retention_days=14)
        if not workflow.eval_sets.filter(name=TICKET_EVAL_SET).exists():
            cases = []
            for n in range(TICKET_EVAL_CASES):
                text, category = demo_ticket(10_000 + n)  # not among the tickets the demo sends
                cases.append({"prompt": ticket_prompt(text), "expected": category, "scorer": "exact"})
            eval_set_create(workflow=workflow, name=TICKET_EVAL_SET, cases=cases, user=admin)
    return workflow
