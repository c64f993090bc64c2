"""The training run page in headless Chromium: the charts are drawn, and redrawn when new versions land."""

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
from tests.factories import fabricate_run, make_user
from training.models import GlobalVersionRecord

pytestmark = pytest.mark.browser

POINTS = "#chart-loss_tokens g.trace.scatter path.point"


def test_the_run_page_draws_its_charts_and_updates_them_as_versions_arrive(
    live_server: Any,
    browser: Browser,  # noqa: F811
) -> None:
    # An auditor: the money chart and the cost so far are for those who may see costs.
    make_user(Role.AUDITOR, username="watcher", password="watch-password-1")
    run = fabricate_run("browser")

    page = browser.new_page()
    page.goto(f"{live_server.url}/training/{run.pk}/")
    assert "/login/" in page.url
    page.fill("input[name=username]", "watcher")
    page.fill("input[name=password]", "watch-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/training/{run.pk}/")

    for chart in ("loss_tokens", "loss_wall", "loss_money", "train_loss", "bytes", "merged"):
        page.wait_for_selector(f"#chart-{chart} .main-svg", timeout=30_000)
    assert page.locator(POINTS).count() == 3
    assert page.locator("#chart-train_loss g.trace.scatter").count() == 2

    # A new global version lands; the page's next refresh (metrics.json + Plotly.react) draws it.
    GlobalVersionRecord.objects.create(
        run=run,
        fragment=0,
        version=3,
        published_at=timezone.now() + timedelta(seconds=3),
        eval_loss=2.5,
        tokens_total=3000,
        learners_merged=[0, 1],
        bytes_in=2048,
        cost_so_far=Decimal("6.0"),
        wall_seconds=30.0,
    )
    # ...and a finished chunk is billed: 1 accelerator-hour at learner 0's cluster price of 2.00.
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=timezone.now(),
        idempotency_key=f"browser:{run.pk}:more",
        subject_type="training_run",
        subject_id=str(run.pk),
        cluster=run.learners.get(index=0).cluster,
    )
    page.wait_for_function(f"document.querySelectorAll('{POINTS}').length === 4", timeout=30_000)
    assert int(page.evaluate("document.body.dataset.chartsDrawn")) >= 2
    page.wait_for_function("document.getElementById('run-cost').textContent === '6.50 USD'", timeout=30_000)
