"""Recommendations from a finished replay study: the derivation rules, one-click accept as a
new routing-policy version, dismiss with a reason, staleness, team scoping, and the figures
reconciled with the ledger. Requests are real: routed through loopback providers and billed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from bench.mockprovider import MockProviderServer
from billing.models import Budget, UsageRecord
from decisions.models import Recommendation, ReplayStudy
from decisions.recommendations.derive import budget_checks, recommendations_from_study
from decisions.recommendations.selectors import recommendation_reconcile
from decisions.recommendations.services import (
    RecommendationConflict,
    RecommendationError,
    recommendation_accept,
    recommendation_dismiss,
)
from inference.adapters.base import ChatMessage, ChatRequest
from inference.router.entry import route
from registry.audit.models import AuditEntry
from registry.auth.roles import Role
from registry.models import Deployment, RoutingPolicyVersion, Workflow
from registry.selectors import workflow_current_policy
from registry.services import workflow_policy_change, workflow_switch_primary
from tests.decisions.recommendation_builders import Side, finished_study, live_requests
from tests.factories import api_client, make_member, make_team, make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db


N = 10
BASE_SCORES = [
    Decimal(s) for s in ("0.90", "0.92", "0.88", "0.91", "0.89", "0.90", "0.92", "0.88", "0.91", "0.89")
]
# Half the answers one point worse: a paired difference of -0.005 +- 0.0033, inside the margin.
GOOD_SCORES = [s - Decimal("0.01") if i < 5 else s for i, s in enumerate(BASE_SCORES)]
WORSE_SCORES = [s - Decimal("0.05") for s in BASE_SCORES]
# 1000 tokens in and 500 out per call (the loopback provider's answer).
BASE_COST = Decimal("0.002500000")  # $1 / $3 per 1M
CHEAP_COST = Decimal("0.001250000")  # $0.5 / $1.5 per 1M


@dataclass
class World:
    owner: User
    workflow: Workflow
    base: Deployment
    cheap: Deployment
    spare: Deployment
    originals: list[int]


@pytest.fixture
def world(admin_user: User, mock_provider: Callable[..., MockProviderServer]) -> World:
    server = mock_provider(tokens_in=1000, tokens_out=500)
    base = priced_deployment(server)  # $1 / $3 per 1M
    cheap = priced_deployment(server, in_price=Decimal("0.5"), out_price=Decimal("1.5"))
    spare = priced_deployment(server, in_price=Decimal("2"), out_price=Decimal("6"))
    workflow = routed_workflow(
        admin_user, [base, spare, cheap], max_cost_per_request=Decimal("0.5"), team=make_team("support")
    )
    return World(admin_user, workflow, base, cheap, spare, live_requests(workflow, N))


def _study(world: World, *, cheap_scores: list[Decimal] = GOOD_SCORES) -> ReplayStudy:
    return finished_study(
        workflow=world.workflow,
        owner=world.owner,
        baseline=Side(world.base, BASE_SCORES, latency_p95_ms=100.0),
        candidates=[Side(world.cheap, cheap_scores, latency_p95_ms=140.0)],
        originals=world.originals,
    )


def _proposal(world: World) -> Recommendation:
    derived = recommendations_from_study(study_id=_study(world).pk)
    assert len(derived.recommendations) == 1, derived.verdicts
    return derived.recommendations[0]


# --- Deriving ------------------------------------------------------------------------------------


def test_a_cheaper_candidate_as_good_as_the_primary_is_proposed_with_its_figures(world: World) -> None:
    rec = _proposal(world)
    policy = workflow_current_policy(workflow=world.workflow)
    assert (rec.state, rec.kind, rec.from_deployment, rec.to_deployment, rec.policy_version) == (
        "proposed",
        "switch_primary",
        world.base,
        world.cheap,
        policy,
    )
    assert (rec.cost_per_request_before, rec.cost_per_request_after) == (BASE_COST, CHEAP_COST)
    assert rec.cost_change_percent == Decimal("-50.0")
    assert (rec.quality_before, rec.quality_after) == (Decimal("0.9000"), Decimal("0.8950"))
    assert rec.quality_diff == Decimal("-0.0050") and Decimal("0") < rec.quality_diff_ci < Decimal("0.01")
    assert (rec.latency_p95_delta_ms, rec.replayed_requests, rec.replayed_requests_before) == (40.0, N, N)
    assert rec.summary.startswith(
        f"switch {world.workflow.slug}'s primary from {world.base.slug} to {world.cheap.slug}: "
        "\u221250% cost per request, quality 0.90 \u2192 0.90 (95% CI \u00b1"
    )
    assert rec.summary.endswith(", p95 +40 ms, from 10 replayed requests")
    # The evidence: the study and both candidates; no budget covers the workflow here.
    assert rec.study is not None and rec.candidate is not None and rec.baseline_candidate is not None
    assert rec.candidate.deployment == world.cheap and rec.baseline_candidate.deployment == world.base
    assert rec.budget_checks == []


def test_deriving_twice_finds_the_same_proposal(world: World) -> None:
    study = _study(world)
    first = recommendations_from_study(study_id=study.pk).recommendations
    second = recommendations_from_study(study_id=study.pk).recommendations
    assert [r.pk for r in first] == [r.pk for r in second]
    assert Recommendation.objects.count() == 1


def test_the_task_derives_and_waits_for_journaled_ledger_rows(world: World) -> None:
    from decisions.recommendations.derive import LedgerPending
    from decisions.recommendations.tasks import recommendations_derive
    from inference.models import InferenceRequest

    study = _study(world)
    journaled = study.candidates.get(deployment=world.cheap).results.first().replay_request_id  # type: ignore[union-attr]
    InferenceRequest.objects.filter(pk=journaled).update(ledger_pending={"attempts": []})
    with pytest.raises(LedgerPending):
        recommendations_from_study(study_id=study.pk)
    assert Recommendation.objects.count() == 0
    InferenceRequest.objects.filter(pk=journaled).update(ledger_pending=None)  # folded
    assert recommendations_derive.apply(args=[study.pk]).get() == 1
    assert recommendations_derive.apply(args=[study.pk]).get() == 1  # a second delivery: the same row
    assert Recommendation.objects.filter(study=study, state="proposed").count() == 1


def test_a_study_that_has_not_finished_proposes_nothing(world: World) -> None:
    study = _study(world)
    ReplayStudy.objects.filter(pk=study.pk).update(state=ReplayStudy.State.RUNNING)
    assert recommendations_from_study(study_id=study.pk).recommendations == []


def test_a_candidate_whose_quality_ci_falls_below_the_floor_is_not_proposed(world: World) -> None:
    workflow_policy_change(
        workflow=world.workflow,
        deployments=[world.base, world.spare, world.cheap],
        author=world.owner,
        reason="floor",
        quality_floor=Decimal("0.89"),
    )
    derived = recommendations_from_study(study_id=_study(world).pk)
    assert derived.recommendations == [] and Recommendation.objects.count() == 0
    assert "below the floor" in derived.verdicts[0].reason


def test_a_cheaper_but_worse_candidate_is_not_proposed(world: World) -> None:
    derived = recommendations_from_study(study_id=_study(world, cheap_scores=WORSE_SCORES).pk)
    assert derived.recommendations == []
    assert "worse than the baseline" in derived.verdicts[0].reason


def test_a_dearer_candidate_is_not_proposed(world: World) -> None:
    study = finished_study(
        workflow=world.workflow,
        owner=world.owner,
        baseline=Side(world.base, BASE_SCORES),
        candidates=[Side(world.spare, BASE_SCORES)],
        originals=world.originals,
    )
    derived = recommendations_from_study(study_id=study.pk)
    assert derived.recommendations == [] and derived.verdicts[0].reason == "not cheaper per request"


def test_a_candidate_whose_projected_spend_breaks_a_budget_is_not_proposed(world: World) -> None:
    study = _study(world)
    # The new primary's provider may spend 0.01 this month: its replay spent 0.0125 already.
    Budget.objects.create(
        name="cheap provider",
        scope=Budget.Scope.PROVIDER,
        provider=world.cheap.provider,
        limit_amount=Decimal("0.01"),
    )
    derived = recommendations_from_study(study_id=study.pk)
    assert derived.recommendations == []
    assert derived.verdicts[0].reason == "over budget: cheap provider"


def test_a_roomy_budget_is_checked_and_recorded(world: World) -> None:
    study = _study(world)
    Budget.objects.create(
        name="support", scope=Budget.Scope.WORKFLOW, workflow=world.workflow, limit_amount=Decimal("1000")
    )
    rec = recommendations_from_study(study_id=study.pk).recommendations[0]
    assert [(c["name"], c["fits"]) for c in rec.budget_checks] == [("support", True)]


def test_a_budget_already_spent_fits_no_cheaper_candidate(world: World) -> None:
    """The workflow's live requests spent 0.025 against a 0.004 budget: savings on the requests
    to come cannot bring the period back under its limit, so the check says over (it used to
    subtract them from the spend and answer fits with a negative projection)."""
    study = _study(world)
    Budget.objects.create(
        name="support", scope=Budget.Scope.WORKFLOW, workflow=world.workflow, limit_amount=Decimal("0.004")
    )
    derived = recommendations_from_study(study_id=study.pk)
    assert derived.recommendations == []
    assert derived.verdicts[0].reason == "over budget: support"


def test_a_projection_never_falls_below_what_the_period_spent(world: World) -> None:
    budget = Budget.objects.create(
        name="support", scope=Budget.Scope.WORKFLOW, workflow=world.workflow, limit_amount=Decimal("0.004")
    )
    [check] = budget_checks(
        workflow=world.workflow,
        baseline=world.base,
        candidate=world.cheap,
        before=BASE_COST,
        after=Decimal(0),  # a free candidate saves every future request's whole cost
        currency=budget.currency,
        now=timezone.now(),
    )
    assert Decimal(str(check["projected"])) >= Decimal(str(check["spent"])) > budget.limit_amount
    assert check["fits"] is False


def test_a_newer_study_supersedes_the_older_proposals(world: World) -> None:
    old = _proposal(world)
    new = _proposal(world)
    old.refresh_from_db()
    assert (old.state, new.state) == ("superseded", "proposed")
    assert AuditEntry.objects.filter(object_pk=str(old.pk), content_type__model="recommendation").count() == 2


def test_an_older_study_that_finishes_late_proposes_nothing(world: World) -> None:
    older, newer = _study(world), _study(world)
    assert len(recommendations_from_study(study_id=newer.pk).recommendations) == 1
    assert recommendations_from_study(study_id=older.pk).recommendations == []
    assert list(Recommendation.objects.values_list("study", "state")) == [(newer.pk, "proposed")]


# --- Figures reconcile with the ledger ------------------------------------------------------------


def test_the_cost_figures_equal_the_ledger_rows_of_the_replayed_requests(world: World) -> None:
    rec = _proposal(world)
    check = recommendation_reconcile(recommendation=rec)
    assert check.matches, (check.stored, check.recomputed)
    assert rec.candidate is not None and rec.baseline_candidate is not None
    ids = [str(r.replay_request_id) for r in rec.candidate.results.all()]
    rows = UsageRecord.objects.filter(subject_type="inference_request", subject_id__in=ids)
    assert (rec.ledger_rows_after, rec.ledger_amount_after) == (rows.count(), sum(r.amount for r in rows))
    # To the cent and beyond: what the prices say, what the router reported, what the ledger holds.
    assert rec.ledger_amount_after == CHEAP_COST * N == rec.candidate.cost_total
    assert rec.ledger_amount_before == BASE_COST * N == rec.baseline_candidate.cost_total
    assert rec.cost_per_request_after == rec.candidate.cost_per_request


def test_a_ledger_reversal_later_shows_as_a_mismatch(world: World) -> None:
    from billing.models import Unit
    from billing.services import usage_record

    rec = _proposal(world)
    assert rec.candidate is not None
    request_id = rec.candidate.results.first().replay_request_id  # type: ignore[union-attr]
    usage_record(
        unit=Unit.OUTPUT_TOKENS_1M,
        quantity=Decimal("0.0005"),
        occurred_at=rec.created_at,
        idempotency_key="late-row",
        subject_type="inference_request",
        subject_id=str(request_id),
        deployment=world.cheap,
    )
    assert not recommendation_reconcile(recommendation=rec).matches


# --- Accepting and dismissing ---------------------------------------------------------------------


def test_accepting_writes_a_policy_version_citing_it_and_the_router_follows(
    world: World, operator: User
) -> None:
    rec = _proposal(world)
    before = workflow_current_policy(workflow=world.workflow)
    assert before is not None
    rec = recommendation_accept(recommendation_id=rec.pk, user=operator)
    after = workflow_current_policy(workflow=world.workflow)
    assert after is not None and after.version == before.version + 1
    assert after.reason == (
        f"recommendation #{rec.pk}: {rec.summary} \u2014 evidence /decisions/recommendations/{rec.pk}/"
    )
    assert after.ordered_deployments() == [world.cheap, world.base, world.spare]
    assert (after.strategy, after.quality_floor, after.max_cost_per_request, after.author) == (
        before.strategy,
        before.quality_floor,
        before.max_cost_per_request,
        operator,
    )
    assert (rec.state, rec.decided_by, rec.accepted_policy_version) == ("accepted", operator, after)
    assert rec.decided_at is not None
    result = route(workflow=world.workflow, request=ChatRequest(messages=(ChatMessage("user", "after"),)))
    assert result.ok and result.deployment_slug == world.cheap.slug and result.policy_version == after.version
    with pytest.raises(RecommendationConflict, match="accepted already"):
        recommendation_accept(recommendation_id=rec.pk, user=operator)


def test_a_proposal_is_stale_once_the_route_moved_on(world: World, operator: User) -> None:
    rec = _proposal(world)
    workflow_switch_primary(workflow=world.workflow, deployment=world.spare, author=operator, reason="drill")
    versions = RoutingPolicyVersion.objects.filter(workflow=world.workflow).count()
    with pytest.raises(RecommendationConflict, match="stale"):
        recommendation_accept(recommendation_id=rec.pk, user=operator)
    rec.refresh_from_db()
    assert (
        rec.state == "proposed"
        and RoutingPolicyVersion.objects.filter(workflow=world.workflow).count() == versions
    )


def test_dismissing_needs_a_reason_and_records_it(world: World, operator: User) -> None:
    rec = _proposal(world)
    with pytest.raises(RecommendationError) as refused:
        recommendation_dismiss(recommendation_id=rec.pk, user=operator, reason="   ")
    assert refused.value.field_errors() == {"reason": ["say why the recommendation is dismissed"]}
    rec = recommendation_dismiss(recommendation_id=rec.pk, user=operator, reason="B's terms forbid EU data")
    assert (rec.state, rec.dismiss_reason, rec.decided_by) == (
        "dismissed",
        "B's terms forbid EU data",
        operator,
    )
    assert workflow_current_policy(workflow=world.workflow) == rec.policy_version  # the route is as it was


# --- The API --------------------------------------------------------------------------------------


def test_the_api_lists_accepts_and_refuses_what_it_must(world: World, operator: User) -> None:
    rec = _proposal(world)
    client = api_client(operator)
    listed = client.get("/api/recommendations/?state=proposed").json()["results"]
    assert [r["id"] for r in listed] == [rec.pk]
    assert listed[0]["cost"]["per_request_after"] == str(CHEAP_COST)
    assert listed[0]["evidence"]["study"] == rec.study_id
    assert len(listed[0]["evidence"]["replayed_request_ids"]) == N
    assert client.get("/api/recommendations/?state=nope").status_code == 400

    blank = client.post(f"/api/recommendations/{rec.pk}/dismiss/", {"reason": ""}, format="json")
    assert blank.status_code == 400 and "reason" in blank.json()
    accepted = client.post(f"/api/recommendations/{rec.pk}/accept/", {}, format="json")
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["state"] == "accepted"
    assert (
        accepted.json()["accepted_policy_version"] == workflow_current_policy(workflow=world.workflow).version
    )  # type: ignore[union-attr]
    again = client.post(f"/api/recommendations/{rec.pk}/accept/", {}, format="json")
    assert again.status_code == 409
    dismissed = client.post(f"/api/recommendations/{rec.pk}/dismiss/", {"reason": "late"}, format="json")
    assert dismissed.status_code == 409


def test_the_api_answers_409_for_a_stale_proposal(world: World, operator: User) -> None:
    rec = _proposal(world)
    workflow_switch_primary(workflow=world.workflow, deployment=world.spare, author=operator, reason="drill")
    client = api_client(operator)
    assert client.get(f"/api/recommendations/{rec.pk}/").json()["stale"] is True
    response = client.post(f"/api/recommendations/{rec.pk}/accept/", {}, format="json")
    assert response.status_code == 409 and "stale" in str(response.json())
    listing = _page(operator).get("/decisions/recommendations/?state=proposed").content.decode()
    assert f'data-recommendation="{rec.pk}"' in listing and "(stale)" in listing


def test_team_scoping_hides_other_teams_and_keeps_viewers_from_deciding(world: World) -> None:
    rec = _proposal(world)  # the support team's workflow
    outsider = make_member(make_team("research"), Role.OPERATOR)
    response = api_client(outsider).get(f"/api/recommendations/{rec.pk}/")
    assert response.status_code == 404
    assert api_client(outsider).get("/api/recommendations/").json()["results"] == []
    assert api_client(outsider).post(
        f"/api/recommendations/{rec.pk}/accept/", {}, format="json"
    ).status_code in (
        403,
        404,
    )

    viewer = make_member(make_team("support"), Role.VIEWER)
    client = api_client(viewer)
    seen = client.get(f"/api/recommendations/{rec.pk}/")
    assert seen.status_code == 200 and "cost" not in seen.json()  # a viewer sees no money
    assert client.post(f"/api/recommendations/{rec.pk}/accept/", {}, format="json").status_code == 403
    assert (
        client.post(f"/api/recommendations/{rec.pk}/dismiss/", {"reason": "x"}, format="json").status_code
        == 403
    )

    member = make_member(make_team("support"), Role.OPERATOR)
    assert (
        api_client(member).post(f"/api/recommendations/{rec.pk}/accept/", {}, format="json").status_code
        == 200
    )


# --- The pages ------------------------------------------------------------------------------------


def _page(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_pages_show_the_figures_the_evidence_and_take_decisions(world: World, operator: User) -> None:
    rec = _proposal(world)
    client = _page(operator)
    listing = client.get("/decisions/recommendations/")
    assert listing.status_code == 200 and escape(rec.summary) in listing.content.decode()
    assert client.get("/decisions/recommendations/?team=research").status_code == 400

    detail = client.get(f"/decisions/recommendations/{rec.pk}/").content.decode()
    assert str(CHEAP_COST) in detail and 'id="rec-reconciled"' in detail and 'id="accept"' in detail
    assert f"subject_id={rec.candidate.results.first().replay_request_id}" in detail  # type: ignore[union-attr]

    blank = client.post(f"/decisions/recommendations/{rec.pk}/", {"action": "dismiss", "reason": ""})
    assert blank.status_code == 400 and "This field is required." in blank.content.decode()
    done = client.post(f"/decisions/recommendations/{rec.pk}/", {"action": "dismiss", "reason": "not now"})
    assert done.status_code == 302
    rec.refresh_from_db()
    assert (rec.state, rec.dismiss_reason) == ("dismissed", "not now")
    again = client.post(f"/decisions/recommendations/{rec.pk}/", {"action": "accept"})
    assert again.status_code == 409 and "dismissed already" in again.content.decode()


def test_the_pages_keep_viewers_and_other_teams_out(world: World) -> None:
    rec = _proposal(world)
    viewer = make_member(make_team("support"), Role.VIEWER)
    page = _page(viewer).get(f"/decisions/recommendations/{rec.pk}/")
    assert page.status_code == 200 and 'id="accept"' not in page.content.decode()
    assert str(CHEAP_COST) not in page.content.decode()  # no money for a viewer
    assert (
        _page(viewer).post(f"/decisions/recommendations/{rec.pk}/", {"action": "accept"}).status_code == 403
    )
    outsider = make_member(make_team("research"), Role.OPERATOR)
    assert _page(outsider).get(f"/decisions/recommendations/{rec.pk}/").status_code == 404
    assert escape(rec.summary) not in _page(outsider).get("/decisions/recommendations/").content.decode()
    platform_viewer = make_user(Role.VIEWER)
    assert (
        _page(platform_viewer).post(f"/decisions/recommendations/{rec.pk}/", {"action": "accept"}).status_code
        == 403
    )


def test_models_are_exported(db: Any) -> None:
    from decisions import models

    assert "Recommendation" in models.__all__
