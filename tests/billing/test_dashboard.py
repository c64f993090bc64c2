"""The billing dashboard: exact figures from rollups plus tail, each linked to its ledger rows."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Budget, Unit, UsageRecord
from billing.rollups import rollups_update
from billing.services import UsageInput, usage_record_batch
from inference.models import QualityRecord
from inference.services import quality_record_create
from tests.factories import make_cluster, make_deployment, make_price, make_user, make_workflow

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def month_of_spend(operator: Any) -> dict[str, Any]:
    now = timezone.now()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    cluster = make_cluster(slug="gpu-east", price=None)
    make_price(cluster=cluster, unit_price=Decimal("2.000000"), effective_from=start - timedelta(days=40))
    deployment = make_deployment(slug="chat-east")
    make_price(deployment=deployment, unit=Unit.OUTPUT_TOKENS_1M, unit_price=Decimal("0.600000"),
               effective_from=start - timedelta(days=40))  # fmt: skip
    workflow = make_workflow(owner=operator, deployments=[deployment], slug="triage")
    items = [
        UsageInput(unit=Unit.ACCELERATOR_HOUR, quantity=Decimal("1.5"), occurred_at=start + timedelta(minutes=i),
                   idempotency_key=f"train:{i}", subject_type="training_run", subject_id="42", cluster=cluster)
        for i in range(4)
    ] + [
        UsageInput(unit=Unit.OUTPUT_TOKENS_1M, quantity=Decimal("0.25"), occurred_at=start + timedelta(minutes=i),
                   idempotency_key=f"req:{i}", subject_type="inference_request", subject_id=str(i),
                   deployment=deployment, workflow=workflow)
        for i in range(3)
    ]  # fmt: skip
    usage_record_batch(items=items[:5])
    rollups_update()  # part folded, part still in the tail
    usage_record_batch(items=items[5:])
    return {"start": start}


def test_the_dashboard_shows_exact_month_to_date_split_and_top_lists(
    month_of_spend: Any, auditor: Any
) -> None:
    page = _client(auditor).get("/billing/")
    assert page.status_code == 200
    html = page.content.decode()
    # 4 × 1.5 h × 2.00 + 3 × 0.25 M tokens × 0.60 = 12.00 + 0.45
    assert re.search(r"12\.45 USD", html)
    split = html[html.index('id="split"') :]
    assert "training and compute" in split and "12.00 USD" in split
    assert "inference" in split and "0.45 USD" in split
    assert ">triage</a>" in html and ">run 42</a>" in html and ">gpu-east</a>" in html
    assert 'src="/assets/plotly.min.js"' in html


def test_each_figure_links_to_the_rows_that_add_up_to_it(month_of_spend: Any, auditor: Any) -> None:
    client = _client(auditor)
    html = client.get("/billing/").content.decode()
    link = re.search(r'href="(/billing/ledger/\?[^"]*workflow=triage[^"]*)"', html)
    assert link is not None
    rows_page = client.get(link.group(1).replace("&amp;", "&"))
    assert rows_page.status_code == 200
    assert rows_page.context["total"] == Decimal("0.45")
    assert {r.workflow.slug for r in rows_page.context["rows"]} == {"triage"}
    run_page = client.get("/billing/ledger/", {"training_run": "42"})
    assert run_page.context["total"] == Decimal("12") and len(run_page.context["rows"]) == 4


def test_the_ledger_page_pages_by_row_id_and_rejects_bad_filters(month_of_spend: Any, auditor: Any) -> None:
    client = _client(auditor)
    everything = client.get("/billing/ledger/")
    assert [r.sequence for r in everything.context["rows"]] == [7, 6, 5, 4, 3, 2, 1]
    older = client.get("/billing/ledger/", {"before": everything.context["rows"][3].pk})
    assert [r.sequence for r in older.context["rows"]] == [3, 2, 1]
    bad = client.get("/billing/ledger/", {"since": "yesterday", "unit": "bananas"})
    assert bad.status_code == 400
    assert set(bad.context["form"].errors) == {"since", "unit"}
    assert UsageRecord.objects.count() == 7


def test_budgets_appear_with_their_forecast(month_of_spend: Any, auditor: Any) -> None:
    Budget.objects.create(name="gpu-monthly", scope=Budget.Scope.TRAINING_RUN, training_run_id="42",
                          limit_amount=Decimal("20"), thresholds=[50, 100])  # fmt: skip
    html = _client(auditor).get("/billing/").content.decode()
    table = html[html.index('id="budgets"') :]
    assert "gpu-monthly" in table and "12.00 USD" in table and "60.0%" in table


def test_viewers_may_not_see_billing(viewer: Any) -> None:
    assert _client(viewer).get("/billing/").status_code == 403
    assert _client(viewer).get("/billing/ledger/").status_code == 403
    assert _client(make_user(None)).get("/billing/").status_code == 403


def test_the_dashboard_sets_cloud_token_prices_beside_self_hosted_ones(
    month_of_spend: Any, auditor: Any
) -> None:
    html = _client(auditor).get("/billing/").content.decode()
    table = html[html.index('id="token-prices"') :]
    assert "chat-east" in table and "0.60 USD" in table and "price v1" in table


def test_cost_per_quality_point_divides_the_ledgers_cost_per_1m_output_tokens_by_the_mean_score(
    auditor: Any, operator: Any
) -> None:
    now = timezone.now()
    cheap, dear, unscored = (make_deployment(slug=s) for s in ("q-cheap", "q-dear", "q-unscored"))
    for deployment, (input_price, output_price) in (
        (cheap, ("0.100000", "0.400000")),
        (dear, ("1.000000", "3.000000")),
        (unscored, ("1", "1")),
    ):
        make_price(deployment=deployment, unit=Unit.INPUT_TOKENS_1M, unit_price=Decimal(input_price))
        make_price(deployment=deployment, unit=Unit.OUTPUT_TOKENS_1M, unit_price=Decimal(output_price))
    workflow = make_workflow(owner=operator, deployments=[cheap, dear, unscored], slug="scored")
    items = [
        UsageInput(unit=unit, quantity=quantity, occurred_at=now - timedelta(hours=1),
                   idempotency_key=f"q:{d.slug}:{unit}", subject_type="inference_request", subject_id=d.slug,
                   deployment=d, workflow=workflow)
        for d in (cheap, dear, unscored)
        for unit, quantity in ((Unit.INPUT_TOKENS_1M, Decimal("2")), (Unit.OUTPUT_TOKENS_1M, Decimal("0.5")))
    ]  # fmt: skip
    usage_record_batch(items=items)
    for deployment, scores in ((cheap, ("0.5", "0.7")), (dear, ("0.9", "0.9"))):
        for score in scores:
            quality_record_create(
                deployment=deployment, score=Decimal(score), source=QualityRecord.Source.EVAL
            )

    html = _client(auditor).get("/billing/").content.decode()
    card = html[html.index('id="quality-cost"') :].split("</div>")[0]
    # cheap: (2 x 0.10 + 0.5 x 0.40) / 0.5M = 0.80 per 1M output tokens, at 60 points: 0.0133...
    # dear: (2 x 1.00 + 0.5 x 3.00) / 0.5M = 7.00 per 1M, at 90 points: 0.0777...; cheapest first.
    rows = re.findall(r"<tr><td>([\w-]+)</td><td[^>]*>([\d.]+) pts</td><td>([\d.]+) USD</td>", card)
    assert rows == [("q-cheap", "60.0", "0.013333333"), ("q-dear", "90.0", "0.077777778")]
    assert "0.80 USD/1M (ledger)" in card and "7.00 USD/1M (ledger)" in card
    assert "q-unscored" not in card  # no score, no quality point to divide by


def test_the_cost_per_quality_card_says_when_there_are_no_scores(auditor: Any) -> None:
    html = _client(auditor).get("/billing/").content.decode()
    card = html[html.index('id="quality-cost"') :].split("</div>")[0]
    assert "no quality scores in the last 30 days" in card
