"""An operator in headless Chromium opens a recommendation from the nav and accepts it in one click."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import Browser

from bench.mockprovider import Behaviour, MockProviderServer
from decisions.recommendations.derive import recommendations_from_study
from inference.adapters.http_client import close_all
from inference.breaker import breakers as breaker
from inference.selectors import route_cache_invalidate
from registry.auth.roles import Role
from registry.selectors import workflow_current_policy
from tests.decisions.recommendation_builders import Side, finished_study, live_requests
from tests.factories import make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.browser


def _clean_breakers() -> None:
    store = breaker.breakers()
    if isinstance(store, breaker.RedisBreakers):
        keys = list(store.redis.scan_iter("sy:*"))
        if keys:
            store.redis.delete(*keys)
    else:
        store._state.clear()
        store._lat.clear()
        store._once.clear()
    route_cache_invalidate()


@pytest.fixture
def provider() -> Iterator[MockProviderServer]:
    _clean_breakers()
    server = MockProviderServer(Behaviour(tokens_in=1000, tokens_out=500)).start()
    yield server
    server.stop()
    close_all()
    _clean_breakers()


def test_an_operator_accepts_a_recommendation_in_one_click(
    live_server: Any, browser: Browser, provider: MockProviderServer
) -> None:
    operator = make_user(Role.OPERATOR, username="rec-ops", password="rec-ops-password-1")
    base = priced_deployment(provider, slug="ui-primary")
    cheap = priced_deployment(provider, slug="ui-cheaper", in_price=Decimal("0.5"), out_price=Decimal("1.5"))
    workflow = routed_workflow(operator, [base, cheap], slug="ui-triage")
    originals = live_requests(workflow, 4)
    scores = [Decimal("0.9"), Decimal("0.8"), Decimal("0.9"), Decimal("0.8")]
    study = finished_study(
        workflow=workflow,
        owner=operator,
        baseline=Side(base, scores),
        candidates=[Side(cheap, scores)],
        originals=originals,
    )
    rec = recommendations_from_study(study_id=study.pk).recommendations[0]

    page = browser.new_page()
    page.goto(f"{live_server.url}/login/?next=/decisions/recommendations/")
    page.fill("input[name=username]", "rec-ops")
    page.fill("input[name=password]", "rec-ops-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/decisions/recommendations/")
    assert page.locator("header >> text=Recommendations").count() == 1
    assert "switch ui-triage's primary from ui-primary to ui-cheaper" in page.inner_text("#recommendations")

    page.click(f"#recommendations a[href='/decisions/recommendations/{rec.pk}/']")
    page.wait_for_url(f"{live_server.url}/decisions/recommendations/{rec.pk}/")
    assert "matches the ledger today" in page.inner_text("#rec-evidence")
    page.click("#accept")
    page.wait_for_selector("text=Accepted: ui-triage is on policy v2.")
    assert page.inner_text("#rec-state") == "Accepted"

    policy = workflow_current_policy(workflow=workflow)
    assert policy is not None and [d.slug for d in policy.ordered_deployments()] == [
        "ui-cheaper",
        "ui-primary",
    ]
    assert (
        policy.reason.endswith(f"evidence /decisions/recommendations/{rec.pk}/") and policy.author == operator
    )
