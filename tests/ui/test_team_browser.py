"""A team-scoped user in headless Chromium: its team's spend on the dashboard, its team page."""

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
from registry.models import Team
from registry.services import team_membership_set
from tests.factories import make_cluster, make_user

pytestmark = pytest.mark.browser


def test_a_team_user_logs_in_and_sees_only_its_team(live_server: Any, browser: Browser) -> None:
    support = Team.objects.create(slug="support", name="Support")
    Team.objects.create(slug="research", name="Research")
    user = make_user(username="support-op", password="support-password-1")
    team_membership_set(team=support, user=user, role=Role.OPERATOR)
    cluster = make_cluster(slug="team-rack", price=Decimal("2.000000"))
    for team, hours in (("support", 2), ("research", 7)):
        usage_record(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal(hours),
            occurred_at=timezone.now() - timedelta(minutes=5),
            idempotency_key=f"browser-team:{team}",
            subject_type="test",
            subject_id=team,
            cluster=cluster,
            team=team,
        )

    page = browser.new_page()
    page.goto(f"{live_server.url}/login/?next=/billing/")
    page.fill("input[name=username]", "support-op")
    page.fill("input[name=password]", "support-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/billing/")

    # The dashboard: support's 4.00 only, drawn by plotly.js; the selector offers support alone.
    page.wait_for_selector("#spend-chart .main-svg", timeout=30_000)
    assert "4.00 USD" in page.inner_text("#month-to-date")
    assert "18.00 USD" not in page.inner_text("main") and "14.00 USD" not in page.inner_text("main")
    options = page.locator("#team-filter select option").all_inner_texts()
    assert "support" in options and "research" not in options

    # Naming the other team is a form error on the page, not a 500 and not its figures.
    page.goto(f"{live_server.url}/billing/?team=research")
    assert "no team research that you can see" in page.inner_text("#team-filter")
    assert "14.00 USD" not in page.inner_text("main")

    # The nav leads to the team list and the team page: members and the spend chart.
    page.click("#nav-registry summary")
    page.click("header >> text=Teams")
    page.wait_for_url(f"{live_server.url}/teams/")
    assert page.locator("[data-team]").count() == 1
    page.click("#teams a[href='/teams/support/']")
    page.wait_for_url(f"{live_server.url}/teams/support/")
    page.wait_for_selector("#spend-chart .main-svg", timeout=30_000)
    assert page.locator("[data-member=support-op]").count() == 1
    assert "4.00 USD" in page.inner_text("main")
