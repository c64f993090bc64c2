"""One rule for money (registry.auth.roles.can_see_costs): a viewer sees no money figure on any
page, API answer, chart or /v1 header; an auditor (a ledger reader) sees every one of them.

The data carries money figures with distinctive digits; the test walks every page of the URL
conf and every API list and detail as each role and looks for those figures in every format
the pages and the API print money in."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import Unit
from billing.services import usage_record
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import BatchJob, EvalRun, EvalSet
from inference.router.entry import route
from registry.auth.roles import Role
from registry.models import FailoverEvent, RoutingPolicyVersion, Workflow
from registry.services import api_token_create, workflow_policy_change
from stack.urls import router
from tests.factories import make_cluster, make_user
from tests.inference.helpers import priced_deployment, routed_workflow
from training.models import GlobalVersionRecord, PlacementDecision, ProbeJob, TrainingRun

pytestmark = pytest.mark.django_db

CLUSTER_PRICE = Decimal("7.654321")  # per accelerator-hour
IN_PRICE, OUT_PRICE = Decimal("1.234567"), Decimal("9.876543")  # per 1M tokens


@pytest.fixture
def provider() -> Iterator[MockProviderServer]:
    server = MockProviderServer(Behaviour(text="ok", tokens_in=1000, tokens_out=1000)).start()
    yield server
    server.stop()


@dataclass
class World:
    workflow: Workflow
    run: TrainingRun
    job: ProbeJob
    figures: dict[str, Decimal]  # what each figure is -> its value


@pytest.fixture
def world(admin_user: User, provider: MockProviderServer) -> World:
    now = timezone.now()
    cluster = make_cluster(price=CLUSTER_PRICE)
    job = ProbeJob.objects.create(
        cluster=cluster, steps=10, status=ProbeJob.Status.SUCCEEDED, loss_curve=[[1, 5.0], [2, 4.0]]
    )
    job_row = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("0.25"),
        occurred_at=now,
        idempotency_key=f"probe_job:{job.pk}",
        subject_type="probe_job",
        subject_id=str(job.pk),
        cluster=cluster,
    )
    run = TrainingRun.objects.create(
        name="priced", config={"money_budget": "86.4197", "currency": "USD"}, money_budget=Decimal("86.4197")
    )
    run.transition(TrainingRun.State.PLACING, reason="placing")
    run.transition(TrainingRun.State.RUNNING, reason="placed")
    PlacementDecision.objects.create(
        run=run,
        learner_index=0,
        generation=0,
        cluster=cluster,
        reason=PlacementDecision.Reason.INITIAL,
        unit_price=CLUSTER_PRICE,
        candidates=[{"cluster": cluster.slug, "price": str(CLUSTER_PRICE), "rejected": ""}],
    )
    GlobalVersionRecord.objects.create(
        run=run, fragment=0, version=1, published_at=now, eval_loss=3.5, tokens_total=100,
        learners_merged=[0], bytes_in=10, cost_so_far=Decimal("13.579246"), wall_seconds=5.0,
    )  # fmt: skip
    run_row = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("2"),
        occurred_at=now,
        idempotency_key=f"training_run:{run.pk}",
        subject_type="training_run",
        subject_id=str(run.pk),
        cluster=cluster,
    )
    FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.TRAINING, from_cluster=cluster, to_cluster=cluster, subject=f"run {run.pk}",
        reason="lost", detected_at=now - timedelta(seconds=5), recovered_at=now,
        extra_cost=Decimal("0.864213"), training_run_id=run.pk,
    )  # fmt: skip

    deployment = priced_deployment(provider, in_price=IN_PRICE, out_price=OUT_PRICE)
    workflow = routed_workflow(admin_user, [deployment])
    workflow_policy_change(
        workflow=workflow, deployments=[deployment], author=admin_user, reason="cap",
        strategy=RoutingPolicyVersion.Strategy.PRIORITY, max_cost_per_request=Decimal("0.424242"),
    )  # fmt: skip
    result = route(workflow=workflow, request=ChatRequest(messages=(ChatMessage("user", "ping"),)))
    assert result.ok
    eval_set = EvalSet.objects.create(workflow=workflow, name="set")
    EvalRun.objects.create(eval_set=eval_set, deployment=deployment, cost=Decimal("0.272727"))
    BatchJob.objects.create(
        workflow=workflow, input_uri="in.jsonl", total=1, cost=Decimal("0.313131"), created_by=admin_user
    )
    FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.INFERENCE, from_deployment=deployment, to_deployment=deployment,
        reason="503", detected_at=now, extra_cost=Decimal("0.191919"), details={"workflow": workflow.slug},
    )  # fmt: skip
    figures = {
        "accelerator-hour price": CLUSTER_PRICE,
        "probe job's ledger amount": job_row.amount,
        "run's money budget": Decimal("86.4197"),
        "run's cost so far at version 1": Decimal("13.579246"),
        "run's ledger amount": run_row.amount,
        "training failover's extra cost": Decimal("0.864213"),
        "input token price": IN_PRICE,
        "output token price": OUT_PRICE,
        "request's cost": result.cost,
        "policy's max cost per request": Decimal("0.424242"),
        "eval run's cost": Decimal("0.272727"),
        "batch job's cost": Decimal("0.313131"),
        "inference failover's extra cost": Decimal("0.191919"),
    }
    return World(workflow=workflow, run=run, job=job, figures=figures)


def _spellings(value: Decimal) -> set[str]:
    """How pages and answers print a money figure: as stored, trimmed, and rounded to 4, 6, 9 places."""
    forms = {f"{value:f}", f"{value.normalize():f}", f"{value:.4f}", f"{value:.6f}", f"{value:.9f}"}
    return {f for f in forms if len(f.replace("0", "").replace(".", "")) >= 4}  # distinctive ones only


def _money_in(text: str, figures: dict[str, Decimal]) -> set[str]:
    found = set()
    for name, value in figures.items():
        for spelling in _spellings(value):
            if re.search(rf"(?<![\d.]){re.escape(spelling)}(?!\d)", text):
                found.add(name)
    return found


def _page_urls(world: World) -> list[str]:
    """Every page of the URL conf (not the admin, the API or /v1), its arguments filled in."""
    slugs = {
        "workflow": world.workflow.slug,
        "provider": world.workflow.policy_versions.first().ordered_deployments()[0].provider.slug,  # type: ignore[union-attr]
    }
    pks = {"job": world.job.pk, "training": world.run.pk}
    urls = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            route_text = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, route_text)
                continue
            assert isinstance(p, URLPattern)
            # /metrics answers scrapers by bearer token or network (tests/stack/test_metrics.py),
            # not users by role: it is no page of theirs.
            if route_text.startswith(("admin/", "api/", "v1/", "logout/", "metrics")):
                continue
            name = p.name or ""
            slug = next((v for k, v in slugs.items() if k in name), "nope")
            pk = next((v for k, v in pks.items() if k in name), 1)
            url = "/" + re.sub(r"<slug:\w+>", slug, re.sub(r"<int:\w+>", str(pk), route_text))
            urls.append(re.sub(r"<str:\w+>", "x", url))

    walk(get_resolver().url_patterns, "")
    return urls


def _api_urls(world: World) -> list[str]:
    urls = [f"/api/{prefix}/?limit=1000" for prefix, _, _ in router.registry]
    return urls + [
        f"/api/workflows/{world.workflow.slug}/",
        f"/api/workflows/{world.workflow.slug}/versions/",
        f"/api/training-runs/{world.run.pk}/",
        f"/api/training-runs/{world.run.pk}/metrics/",
        f"/api/probe-jobs/{world.job.pk}/",
    ]


def _everything_seen_by(user: User, world: World, provider: MockProviderServer) -> dict[str, str]:
    """Every page, API answer and /v1 header a user reaches: url -> text."""
    browser = Client()
    browser.force_login(user)
    api = APIClient()
    _, raw = api_token_create(user=user, name="cost walk")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    seen: dict[str, str] = {}
    for url in _page_urls(world):
        response = browser.get(url)
        assert response.status_code in (200, 302, 403, 404, 405), (url, response.status_code)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        seen[url] = body.decode(errors="replace")
    for url in _api_urls(world):
        response = api.get(url)
        assert response.status_code in (200, 403, 405), (url, response.status_code)
        seen[url] = response.content.decode()
    body = json.dumps({"model": world.workflow.slug, "messages": [{"role": "user", "content": "ping"}]})
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", body, content_type="application/json"
    )
    assert answer.status_code == 200
    seen["/v1/chat/completions headers"] = json.dumps(dict(answer.headers))
    return seen


def test_a_viewer_sees_no_money_anywhere(world: World, provider: MockProviderServer) -> None:
    seen = _everything_seen_by(make_user(Role.VIEWER), world, provider)
    leaks = {url: found for url, text in seen.items() if (found := _money_in(text, world.figures))}
    assert leaks == {}
    headers = json.loads(seen["/v1/chat/completions headers"])
    assert "x-switchyard-cost" not in {k.lower() for k in headers}
    # The pages a viewer reads are there (this is not a walk of 403s).
    assert '"loss_money"' not in seen[f"/training/{world.run.pk}/metrics.json"]
    for url, text in {
        "/": "Cluster health",
        f"/training/{world.run.pk}/": f"Training run #{world.run.pk}",
        f"/jobs/{world.job.pk}/": f"Probe job #{world.job.pk}",
        f"/inference/workflows/{world.workflow.slug}/": f"Workflow {world.workflow.slug}",
    }.items():
        assert text in seen[url], url


@pytest.mark.parametrize("role", [Role.AUDITOR, Role.ADMIN])
def test_a_ledger_reader_sees_every_money_figure(
    world: World, provider: MockProviderServer, role: Role
) -> None:
    seen = _everything_seen_by(make_user(role), world, provider)
    shown = set().union(*(_money_in(text, world.figures) for text in seen.values()))
    assert shown == set(world.figures)
    headers = {k.lower() for k in json.loads(seen["/v1/chat/completions headers"])}
    assert "x-switchyard-cost" in headers
    assert '"loss_money"' in seen[f"/training/{world.run.pk}/metrics.json"]
    # The figures a viewer's pages drop are on the same pages for a ledger reader.
    assert _money_in(seen[f"/jobs/{world.job.pk}/"], world.figures) >= {"probe job's ledger amount"}
    assert "run's money budget" in _money_in(seen[f"/training/{world.run.pk}/"], world.figures)
