"""Inference pages per role, over requests routed through the router against loopback providers."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from bench.mockprovider import MockProviderServer
from billing.models import Unit
from billing.services import UsageInput, usage_record_batch
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import BatchJob, ChaosConfig, EvalRun, InferenceAttempt, InferenceRequest
from inference.quality.services import eval_set_create
from inference.router.entry import route
from inference.services import quality_record_create
from inference.stats_selectors import deployment_stats, pareto_frontier, percentile
from registry.models import FailoverEvent, Team, Workflow
from tests.factories import make_cluster, make_deployment, make_price
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))
ROLES = ["viewer", "operator", "auditor", "admin_user"]


@pytest.fixture
def traffic(admin_user: User, mock_provider: Callable[..., MockProviderServer]) -> dict[str, Any]:
    """A workflow whose primary answers 503 and whose fallback answers: every request fails over."""
    broken = priced_deployment(mock_provider(status=503), slug="pages-broken")
    good = priced_deployment(
        mock_provider(), slug="pages-good", in_price=Decimal("2.000000"), out_price=Decimal("6.000000")
    )
    cheap = priced_deployment(
        mock_provider(), slug="pages-cheap", in_price=Decimal("0.500000"), out_price=Decimal("1.000000")
    )
    self_hosted = make_deployment(slug="pages-selfhosted", hosting_cluster=make_cluster())
    workflow = routed_workflow(admin_user, [broken, good], slug="pages-wf")
    for _ in range(3):
        result = route(workflow=workflow, request=PING)
        assert result.ok and result.deployment_id == good.pk
    quality_record_create(deployment=good, score=Decimal("0.9"), source="feedback", workflow=workflow)
    quality_record_create(deployment=cheap, score=Decimal("0.6"), source="feedback", workflow=workflow)
    quality_record_create(deployment=broken, score=Decimal("0.5"), source="feedback", workflow=workflow)
    return {
        "workflow": workflow,
        "broken": broken,
        "good": good,
        "cheap": cheap,
        "self_hosted": self_hosted,
    }


def test_stats_count_the_routed_calls_and_flag_the_pareto_frontier(traffic: dict[str, Any]) -> None:
    by_slug = {s.deployment.slug: s for s in deployment_stats()}
    broken, good, cheap = by_slug["pages-broken"], by_slug["pages-good"], by_slug["pages-cheap"]
    assert InferenceRequest.objects.filter(workflow=traffic["workflow"]).count() == 3
    calls_broken = InferenceAttempt.objects.filter(deployment=traffic["broken"]).exclude(
        outcome=InferenceAttempt.Outcome.CIRCUIT_OPEN
    )
    assert broken.calls == calls_broken.count() > 0
    assert broken.error_rate == 1.0
    assert good.calls == 3 and good.error_rate == 0.0
    assert good.p50_ms is not None and good.p95_ms is not None and good.p50_ms <= good.p95_ms
    assert sum(good.spend.values()) == sum(
        r.cost for r in InferenceAttempt.objects.filter(deployment=traffic["good"])
    )
    assert sum(good.spend.values()) > 0
    # Blended $/1M (input:output 1:3): cheap 0.875 (q 0.6), broken 2.5 (q 0.5), good 5 (q 0.9):
    # cheap is both cheaper and better than broken, so broken is off the frontier.
    assert good.on_frontier and cheap.on_frontier and not broken.on_frontier
    assert by_slug["pages-selfhosted"].price.self_hosted


def test_pareto_and_percentile_helpers() -> None:
    flags = pareto_frontier([(Decimal(1), 0.5), (Decimal(2), 0.9), (Decimal(2), 0.4), (Decimal(1), 0.5)])
    assert flags == [True, True, False, True]
    assert percentile([], 0.5) is None
    assert percentile([10.0, 20.0, 30.0, 40.0], 0.5) == 25.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 0.95) == pytest.approx(38.5)


@pytest.mark.parametrize("role", ROLES)
def test_home_page_renders_rows_and_the_chart_for_every_role(
    role: str, request: pytest.FixtureRequest, traffic: dict[str, Any]
) -> None:
    client = Client()
    client.force_login(request.getfixturevalue(role))
    response = client.get("/inference/")
    assert response.status_code == 200
    body = response.content.decode()
    for slug in ("pages-broken", "pages-good", "pages-cheap", "pages-selfhosted"):
        assert f'data-deployment="{slug}"' in body
    # Prices and the cost axis are money: not for a viewer (registry.auth.roles.can_see_costs).
    sees_costs = role != "viewer"
    assert ('id="cost-quality-chart"' in body) is sees_costs
    assert ("(self-hosted)" in body) is sees_costs
    assert "/inference/workflows/pages-wf/" in body
    assert 'href="/inference/"' in body  # the nav link


def test_pages_need_a_login() -> None:
    response = Client().get("/inference/")
    assert response.status_code == 302 and "/login" in response["Location"]


@pytest.mark.parametrize("role", ROLES)
def test_workflow_page_shows_route_latency_failovers_and_requests(
    role: str, request: pytest.FixtureRequest, traffic: dict[str, Any]
) -> None:
    client = Client()
    user = request.getfixturevalue(role)
    client.force_login(user)
    response = client.get("/inference/workflows/pages-wf/")
    assert response.status_code == 200
    ctx = response.context
    assert [s.deployment.slug for s, _ in ctx["route"]] == ["pages-broken", "pages-good"]
    assert ctx["latency"].requests == 3 and ctx["latency"].p50_ms is not None
    events = FailoverEvent.objects.filter(
        kind=FailoverEvent.Kind.INFERENCE, from_deployment=traffic["broken"]
    )
    assert len(ctx["failovers"]) == events.count() > 0
    assert [r.pk for r in ctx["requests"]] == list(
        InferenceRequest.objects.filter(workflow=traffic["workflow"])
        .order_by("-created_at")
        .values_list("pk", flat=True)
    )
    body = response.content.decode()
    assert "/workflows/pages-wf/" in body  # link to the stack page with the switch buttons
    assert ('id="chaos-form"' in body) == (role in ("operator", "admin_user"))


def test_operator_sets_the_chaos_error_rate_and_the_router_sees_it(
    operator: User, traffic: dict[str, Any]
) -> None:
    client = Client()
    client.force_login(operator)
    good = traffic["good"]
    response = client.post(
        "/inference/workflows/pages-wf/", {"deployment": good.pk, "enabled": "on", "error_rate": "1"}
    )
    assert response.status_code == 302
    config = ChaosConfig.objects.get(deployment=good)
    assert config.enabled and config.error_rate == 1.0 and config.updated_by == operator
    # Every deployment of the route now fails: the drill is live on the next request.
    result = route(workflow=traffic["workflow"], request=PING)
    assert not result.ok
    assert InferenceRequest.objects.get(pk=result.request_id).status == InferenceRequest.Status.FAILED
    page = client.get("/inference/workflows/pages-wf/").content.decode()
    assert "on, error rate 1.00" in page


def test_chaos_form_rejects_a_rate_above_one_with_a_field_error(
    operator: User, traffic: dict[str, Any]
) -> None:
    client = Client()
    client.force_login(operator)
    response = client.post(
        "/inference/workflows/pages-wf/",
        {"deployment": traffic["good"].pk, "enabled": "on", "error_rate": "1.5"},
    )
    assert response.status_code == 400
    assert "error_rate" in response.context["form"].errors
    assert not ChaosConfig.objects.filter(deployment=traffic["good"]).exists()


def test_viewers_cannot_set_a_chaos_drill(viewer: User, traffic: dict[str, Any]) -> None:
    client = Client()
    client.force_login(viewer)
    response = client.post(
        "/inference/workflows/pages-wf/",
        {"deployment": traffic["good"].pk, "enabled": "on", "error_rate": "1"},
    )
    assert response.status_code == 403
    assert not ChaosConfig.objects.exists()


@pytest.mark.parametrize("role", ROLES)
def test_provider_page_shows_error_rate_circuit_and_spend(
    role: str, request: pytest.FixtureRequest, traffic: dict[str, Any]
) -> None:
    client = Client()
    client.force_login(request.getfixturevalue(role))
    provider = traffic["broken"].provider
    response = client.get(f"/inference/providers/{provider.slug}/")
    assert response.status_code == 200
    totals = response.context["totals"]
    assert totals.error_rate == 1.0 and totals.calls > 0
    assert [s.deployment.slug for s in response.context["stats"]] == ["pages-broken"]
    assert 'class="circuit"' in response.content.decode()
    assert client.get("/inference/providers/no-such-provider/").status_code == 404


def test_operator_starts_an_eval_run_from_the_workflow_page(operator: User, traffic: dict[str, Any]) -> None:
    eval_set = eval_set_create(
        workflow=traffic["workflow"],
        name="smoke",
        cases=[{"prompt": "ping", "expected": "pong", "scorer": "exact"}],
    )
    client = Client()
    client.force_login(operator)
    page = client.get("/inference/workflows/pages-wf/")
    assert [e.name for e in page.context["eval_sets"]] == ["smoke"]
    assert 'id="eval-run-form"' in page.content.decode()
    response = client.post(
        "/inference/workflows/pages-wf/",
        {"action": "eval-run", "eval-eval_set": eval_set.pk, "eval-deployment": traffic["good"].pk},
    )
    assert response.status_code == 302
    run = EvalRun.objects.get(eval_set=eval_set)
    assert run.deployment_id == traffic["good"].pk and run.cases_total == 1 and run.created_by == operator
    assert [r.pk for r in client.get("/inference/workflows/pages-wf/").context["eval_runs"]] == [run.pk]


def test_an_eval_run_on_a_deployment_outside_the_route_is_a_form_error(
    operator: User, traffic: dict[str, Any]
) -> None:
    eval_set = eval_set_create(
        workflow=traffic["workflow"], name="smoke", cases=[{"prompt": "ping", "expected": "pong"}]
    )
    client = Client()
    client.force_login(operator)
    response = client.post(
        "/inference/workflows/pages-wf/",
        {"action": "eval-run", "eval-eval_set": eval_set.pk, "eval-deployment": traffic["cheap"].pk},
    )
    assert response.status_code == 400
    assert "deployment" in response.context["eval_form"].errors
    assert not EvalRun.objects.exists()


def test_workflow_page_lists_the_workflows_batch_jobs_with_progress(
    viewer: User, traffic: dict[str, Any]
) -> None:
    # A row as the batch service leaves it mid-run (the service is built separately; the page
    # only reads the model).
    job = BatchJob.objects.create(
        workflow=traffic["workflow"],
        input_uri="batches/in.jsonl",
        state=BatchJob.State.RUNNING,
        total=10,
        done=4,
        failed=1,
        cost=Decimal("0.000123"),
        created_by=viewer,
    )
    client = Client()
    client.force_login(viewer)
    response = client.get("/inference/workflows/pages-wf/")
    assert [j.pk for j in response.context["batch_jobs"]] == [job.pk]
    body = response.content.decode()
    assert "batches/in.jsonl" in body and "<td>running</td><td>4</td><td>1</td><td>10</td>" in body


def test_stats_for_a_team_count_only_its_workflows_requests(traffic: dict[str, Any]) -> None:
    owner, other = Team.objects.create(slug="owners", name="O"), Team.objects.create(slug="others", name="X")
    Workflow.objects.filter(pk=traffic["workflow"].pk).update(team=owner)
    mine = {s.deployment.slug: s for s in deployment_stats(teams=frozenset({owner.pk}))}
    theirs = {s.deployment.slug: s for s in deployment_stats(teams=frozenset({other.pk}))}
    assert mine["pages-good"].calls == 3 and sum(mine["pages-good"].spend.values()) > 0
    assert theirs["pages-good"].calls == 0 and theirs["pages-good"].spend == {}
    assert theirs["pages-good"].p50_ms is None
    # Price and quality are the shared deployment's own, the same for every team.
    assert theirs["pages-good"].quality == mine["pages-good"].quality


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_trained_models_deployment_shows_its_price_with_the_training_cost_amortised(
    role: str, request: pytest.FixtureRequest
) -> None:
    """Beside the hosting-only $/1M, the same with the model's training cost over 12 months."""
    now = timezone.now()
    cluster = make_cluster(slug="pages-gpu", price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.000000"), effective_from=now - timedelta(days=40))
    served = make_deployment(slug="pages-trained", hosting_cluster=cluster, provider=cluster.provider)
    served.model.training_cost, served.model.produced_by_run_id = Decimal("120"), 3
    served.model.save(update_fields=["training_cost", "produced_by_run_id"])
    make_price(
        deployment=served,
        unit=Unit.INPUT_TOKENS_1M,
        unit_price=Decimal("0"),
        effective_from=now - timedelta(days=40),
    )
    usage_record_batch(items=[
        UsageInput(unit=unit, quantity=Decimal(quantity), occurred_at=now - timedelta(hours=1),
                   idempotency_key=f"pages-trained-{unit}", subject_type="deployment", subject_id=served.slug,
                   cluster=cluster if unit == Unit.ACCELERATOR_HOUR else None, deployment=served)
        for unit, quantity in ((Unit.ACCELERATOR_HOUR, "10"), (Unit.INPUT_TOKENS_1M, "5"))
    ])  # fmt: skip
    client = Client()
    client.force_login(request.getfixturevalue(role))
    body = client.get("/inference/").content.decode()
    assert 'data-deployment="pages-trained"' in body
    # Money: only for the roles that see costs. Hosting-only is 2.00 per 1M (10 h at 1.00 over
    # 5M tokens). The page's 7-day window spans 8 calendar days, so a month is 5M x 30/8 =
    # 18.75M tokens, and 120 over 12 months (10 a month) adds 10 / 18.75 = 0.5333... per 1M
    # (shown with every digit the figure keeps).
    shown = re.search(r"2\.5333+ USD with training amortised over 12 months", body) is not None
    assert shown is (role != "viewer")
