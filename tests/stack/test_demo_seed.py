"""The demo's seed: two teams with a team-scoped operator each, and the cost-quality part's
opted-in workflow that the demo run is scored on; safe to run twice."""

from __future__ import annotations

import socket
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from billing.models import PriceBook, Unit
from registry.auth.roles import Role
from registry.auth.teams import user_team_scope
from registry.models import Deployment, Team, TeamMembership
from stack.demo.cost_quality import CostQualityDemo
from stack.demo.seed import (
    QUICK_SCALE,
    TICKET_EVAL_CASES,
    TICKET_WORKFLOW,
    demo_local_replicas,
    demo_stack_seed,
    demo_ticket_providers,
    demo_ticket_workflow_seed,
    loopback_port,
)
from training.run_config import demo_config
from training.services import training_run_create

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_two_teams_each_with_an_operator_who_sees_only_it() -> None:
    for _ in range(2):  # idempotent
        stack = demo_stack_seed(admin_password="admin-pw-1", now=timezone.now(), team_password="team-pw-1")
    assert stack.team_users == ["support-op", "platform-op"]
    assert set(Team.objects.values_list("slug", flat=True)) >= {"support", "platform"}
    for username, slug in (("support-op", "support"), ("platform-op", "platform")):
        user = User.objects.get(username=username)
        assert user.check_password("team-pw-1") and not user.is_superuser
        assert list(TeamMembership.objects.filter(user=user).values_list("team__slug", "role")) == [
            (slug, Role.OPERATOR)
        ]
        assert user_team_scope(user) == frozenset({Team.objects.get(slug=slug).pk})
    assert user_team_scope(stack.admin) is None


def test_the_cost_quality_seed_opts_a_platform_workflow_in_and_the_demo_run_scores_its_model_on_it() -> None:
    stack = demo_stack_seed(admin_password="admin-pw-1", now=timezone.now(), team_password="team-pw-1")
    specs = demo_ticket_providers(base_port=18_200)
    for _ in range(2):  # idempotent
        workflow = demo_ticket_workflow_seed(providers=specs, admin=stack.admin, now=timezone.now())
    assert (workflow.slug, workflow.team.slug) == (TICKET_WORKFLOW, "platform")
    assert workflow.retain_prompts and workflow.prompt_retention_days == 14
    policy = workflow.policy_versions.get()
    assert [d.slug for d in policy.ordered_deployments()] == ["acme-large", "acme-small"]
    assert policy.quality_floor == Decimal("0.8")
    assert workflow.eval_sets.get().cases.count() == TICKET_EVAL_CASES
    large, small = (Deployment.objects.get(slug=s) for s in ("acme-large", "acme-small"))
    assert large.base_url == "http://127.0.0.1:18200/v1" and small.base_url == "http://127.0.0.1:18201/v1"
    prices = dict(PriceBook.objects.filter(deployment=small).values_list("unit", "unit_price"))
    assert prices == {Unit.INPUT_TOKENS_1M: Decimal("0.4"), Unit.OUTPUT_TOKENS_1M: Decimal("1.6")}

    demo = CostQualityDemo(admin=stack.admin, specs=specs, servers=[], workflow=workflow)
    run = training_run_create(
        config={**demo_config(), "team": "platform", **demo.run_options(stack.clusters[0])},
        created_by=stack.admin,
        name="demo-run",
    )
    assert run.config["build_or_buy"]["workflows"] == [TICKET_WORKFLOW]
    assert run.config["register_every_versions"] == 50


def test_the_quick_demo_run_is_a_valid_shorter_run_scored_as_often_relative_to_its_length() -> None:
    """`manage.py demo --quick` builds its run as the full demo does, with QUICK_SCALE's overrides."""
    stack = demo_stack_seed(admin_password="admin-pw-1", now=timezone.now(), team_password="team-pw-1")
    specs = demo_ticket_providers(base_port=18_200)
    workflow = demo_ticket_workflow_seed(providers=specs, admin=stack.admin, now=timezone.now())
    demo = CostQualityDemo(admin=stack.admin, specs=specs, servers=[], workflow=workflow, scale=QUICK_SCALE)
    run = training_run_create(
        config={
            **demo_config(),
            **QUICK_SCALE.run,
            "team": "platform",
            **demo.run_options(stack.clusters[0]),
        },
        created_by=stack.admin,
        name="demo-run-quick",
    )
    assert run.config["stop"]["outer_steps"] == 20 and run.config["h"] == 10
    assert run.config["register_every_versions"] == 10
    assert run.config["build_or_buy"]["workflows"] == [TICKET_WORKFLOW]
    # The full demo's model, on less data.
    assert run.config["model"].items() >= demo_config()["model"].items()
    assert run.config["data"]["max_train_bytes"] == 200_000


def test_a_demo_port_something_else_holds_is_swapped_for_a_free_one() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        replicas = demo_local_replicas(base_port=busy)
        assert replicas[0].port != busy
        with socket.socket() as check:  # the swapped-in port is one a server can take
            check.bind(("127.0.0.1", replicas[0].port))
    free = loopback_port(0)
    assert loopback_port(free) == free


def test_the_ticket_providers_seed_the_ports_they_bound_when_theirs_are_busy() -> None:
    admin = demo_stack_seed(admin_password="admin-pw-1", now=timezone.now(), team_password="team-pw-1").admin
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        demo = CostQualityDemo.start(admin=admin, base_port=busy, scale=QUICK_SCALE)
    try:
        bound = [server.port for server in demo.servers]
        assert busy not in bound
        assert [spec.port for spec in demo.specs] == bound
        urls = Deployment.objects.filter(slug__in=[s.deployment_slug for s in demo.specs])
        assert sorted(d.base_url for d in urls) == sorted(f"http://127.0.0.1:{p}/v1" for p in bound)
    finally:
        for server in demo.servers:
            server.stop()
