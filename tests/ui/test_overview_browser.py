"""The dashboard in headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser

from billing.models import Unit
from billing.services import usage_record
from registry.auth.roles import Role
from tests.factories import make_cluster, make_deployment, make_user, make_workflow

pytestmark = pytest.mark.browser


def test_an_operator_logs_in_and_sees_the_spend_chart_drawn(live_server: Any, browser: Browser) -> None:
    make_user(Role.OPERATOR, username="ops", password="ops-password-1")
    cluster = make_cluster(slug="browser-cluster", price=Decimal("2.500000"))
    for days_ago, seconds in [(2, 3600), (0, 7200)]:
        usage_record(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal(seconds) / Decimal(3600),
            occurred_at=timezone.now() - timedelta(days=days_ago),
            idempotency_key=f"browser:{days_ago}",
            subject_type="probe_job",
            subject_id=str(days_ago),
            cluster=cluster,
        )

    page = browser.new_page()
    page.goto(f"{live_server.url}/")
    assert "/login/" in page.url  # the dashboard needs a login
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "ops-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    # plotly.js (served from the plotly package) draws the figure into SVG.
    page.wait_for_selector("#spend-chart .main-svg", timeout=30_000)
    bars = page.locator("#spend-chart g.trace.bars path")
    assert bars.count() >= 2  # one bar per day with spend
    assert (page.locator("#spend-chart .legendtext").first.text_content() or "").startswith(
        cluster.provider.slug
    )
    assert "7.50 USD" in page.inner_text("main")  # 1 h + 2 h at 2.50
    assert page.locator("[data-cluster=browser-cluster]").count() == 1


def test_an_operator_switches_the_primary_deployment_in_one_click(live_server: Any, browser: Browser) -> None:
    operator = make_user(Role.OPERATOR, username="ops", password="ops-password-1")
    first, second = make_deployment(slug="dep-first"), make_deployment(slug="dep-second")
    workflow = make_workflow(owner=operator, deployments=[first, second], slug="triage")

    page = browser.new_page()
    page.goto(f"{live_server.url}/login/?next=/workflows/triage/")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "ops-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/workflows/triage/")

    page.fill("input[name=reason]", "primary is rate-limited")
    page.click("text=Make dep-second primary")
    page.wait_for_selector("text=Primary is now dep-second")

    assert page.locator("#route li").first.inner_text().startswith("dep-second")
    policy = workflow.policy_versions.order_by("-version").first()
    assert policy is not None and policy.version == 2
    assert [d.slug for d in policy.ordered_deployments()] == ["dep-second", "dep-first"]
    assert policy.reason == "primary is rate-limited" and policy.author == operator


def test_the_navigation_fits_a_1280_px_screen_in_one_row_and_every_group_opens(
    live_server: Any, browser: Browser
) -> None:
    """Seventeen links in one row wrapped at 1400 px ("Log out admin" over three lines); grouped
    as registry, work, money and administration, the header is one row at 1280 px."""
    make_user(Role.ADMIN, username="a-rather-long-admin-name", password="admin-password-1")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "a-rather-long-admin-name")
    page.fill("input[name=password]", "admin-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    header = page.locator("header").bounding_box()
    brand = page.locator("header .brand").bounding_box()
    assert header is not None and brand is not None
    assert header["height"] < 2.2 * brand["height"]  # one row of links (padding included)
    assert page.evaluate("document.querySelector('header').scrollWidth <= 1280")
    for group, link in [
        ("registry", "Teams"), ("work", "Training"), ("money", "Budgets"), ("admin", "Audit"),
    ]:  # fmt: skip
        target = page.locator(f"#nav-{group} a", has_text=link)
        assert not target.is_visible()
        page.click(f"#nav-{group} summary")
        assert target.is_visible()
        others = page.locator("header details[open]")
        assert others.count() == 1  # opening one group closed the one before
    page.click("#nav-money summary")
    page.click("#nav-money a:has-text('Budgets')")
    page.wait_for_url(f"{live_server.url}/billing/budgets/")
    page.click("#nav-user summary")
    page.click("#nav-user button:has-text('Log out')")
    page.wait_for_url("**/login/**")
