"""The inference pages in headless Chromium: the cost-quality scatter drawn, a chaos drill set."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import Browser

from bench.mockprovider import Behaviour, MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest
from inference.adapters.http_client import close_all
from inference.breaker import breakers as breaker
from inference.models import ChaosConfig
from inference.router.entry import route
from inference.selectors import rolling_caches_clear, route_cache_invalidate
from inference.services import quality_record_create
from registry.auth.roles import Role
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
    rolling_caches_clear()


@pytest.fixture
def providers() -> Iterator[tuple[MockProviderServer, MockProviderServer]]:
    _clean_breakers()
    cheap, good = MockProviderServer(Behaviour()).start(), MockProviderServer(Behaviour()).start()
    yield cheap, good
    cheap.stop()
    good.stop()
    close_all()
    _clean_breakers()


def test_an_operator_sees_the_scatter_and_sets_a_chaos_drill(
    live_server: Any,
    browser: Browser,  # noqa: F811
    providers: tuple[MockProviderServer, MockProviderServer],
) -> None:
    operator = make_user(Role.OPERATOR, username="ops", password="ops-password-1")
    cheap = priced_deployment(providers[0], slug="ui-cheap", in_price=Decimal("0.5"), out_price=Decimal("1"))
    good = priced_deployment(providers[1], slug="ui-good", in_price=Decimal("2"), out_price=Decimal("6"))
    workflow = routed_workflow(operator, [cheap, good], slug="ui-wf")
    for _ in range(2):
        assert route(workflow=workflow, request=ChatRequest(messages=(ChatMessage("user", "hi"),))).ok
    quality_record_create(deployment=cheap, score=Decimal("0.6"), source="feedback", workflow=workflow)
    quality_record_create(deployment=good, score=Decimal("0.9"), source="feedback", workflow=workflow)

    page = browser.new_page()
    page.goto(f"{live_server.url}/login/?next=/inference/")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "ops-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/inference/")

    # plotly.js draws both deployments as points of the scatter, and the frontier line.
    page.wait_for_selector("#cost-quality-chart .main-svg", timeout=30_000)
    assert page.locator("#cost-quality-chart g.trace.scatter").first.locator("path.point").count() == 2
    assert page.locator("[data-deployment=ui-cheap] .circuit").inner_text() == "closed"

    page.click("text=ui-wf")
    page.wait_for_url(f"{live_server.url}/inference/workflows/ui-wf/")
    page.select_option("#chaos-form select[name=deployment]", label="ui-cheap")
    page.fill("#chaos-form input[name=error_rate]", "0.25")
    page.check("#chaos-form input[name=enabled]")
    page.click("#chaos-form button[type=submit]")
    page.wait_for_selector("text=Chaos drill on for ui-cheap")
    assert page.locator("#route [data-deployment=ui-cheap] .chaos").inner_text() == "on, error rate 0.25"
    config = ChaosConfig.objects.get(deployment=cheap)
    assert config.enabled and config.error_rate == 0.25 and config.updated_by == operator
