"""The README's screenshot, taken from the overview page as the demo's admin sees it.

The test seeds the demo's stack (its providers, clusters and prices), two weeks of ledger rows,
probe jobs and a failover event, logs in, checks the page and takes the screenshot: into var/
on every run (the chart's dates move every day, so the committed image is not rewritten by
`make test`), and into docs/img/overview.png with UPDATE_SCREENSHOTS=1: run it so after a change
to the overview page and commit the new image with the change.
"""

from __future__ import annotations

import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Browser

from billing.models import Unit
from billing.services import usage_record
from registry.failover_codes import FailoverCode
from registry.models import Cluster, Deployment, FailoverEvent
from registry.services import failover_event_record, failover_event_recover
from stack.demo.seed import demo_stack_seed
from training.models import ProbeJob

pytestmark = pytest.mark.browser

SCREENSHOT = Path(settings.BASE_DIR) / (
    "docs/img/overview.png" if os.environ.get("UPDATE_SCREENSHOTS") == "1" else "var/screenshots/overview.png"
)
VIEWPORT = {"width": 1280, "height": 800}


def _seed_a_fortnight() -> None:
    now = timezone.now()
    # Prices in force from before the first ledger row the chart shows.
    demo_stack_seed(admin_password="admin-password-1", now=now - timedelta(days=15))
    clusters = {cluster.slug: cluster for cluster in Cluster.objects.all()}
    remote = Deployment.objects.get(slug="openai-gpt-4o-mini")
    for days_ago in range(14):
        day = now - timedelta(days=days_ago, hours=1)
        for slug, hours in [("onprem-a100", 6 + days_ago % 4), ("aws-g5-use1", 3 + days_ago % 3)]:
            usage_record(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal(hours),
                occurred_at=day,
                idempotency_key=f"screenshot:{slug}:{days_ago}",
                subject_type="probe_job",
                subject_id=str(days_ago),
                cluster=clusters[slug],
            )
        usage_record(
            unit=Unit.OUTPUT_TOKENS_1M,
            quantity=Decimal(2 + days_ago % 5),
            occurred_at=day,
            idempotency_key=f"screenshot:openai:{days_ago}",
            subject_type="inference_request",
            subject_id=str(days_ago),
            deployment=remote,
        )
    Cluster.objects.update(status=Cluster.Status.HEALTHY, last_heartbeat_at=now)
    for slug, loss in [("onprem-a100", 2.412), ("aws-g5-use1", 2.437)]:
        ProbeJob.objects.create(
            cluster=clusters[slug],
            steps=300,
            status=ProbeJob.Status.SUCCEEDED,
            started_at=now - timedelta(minutes=9),
            finished_at=now - timedelta(minutes=8),
            final_loss=loss,
            accelerator_seconds=Decimal("41.250"),
        )
    event = failover_event_record(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH,
        code=FailoverCode.HEARTBEAT_TIMEOUT,
        reason="no heartbeat from aws-g5-use1 for 30 s",
        detected_at=now - timedelta(minutes=6),
        from_cluster=clusters["aws-g5-use1"],
    )
    failover_event_recover(event=event, recovered_at=now - timedelta(minutes=5))


def test_the_overview_page_is_the_readmes_screenshot(live_server: Any, browser: Browser) -> None:
    _seed_a_fortnight()

    page = browser.new_page(viewport=VIEWPORT)
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    page.wait_for_selector("#spend-chart .main-svg", timeout=30_000)
    assert page.locator("#cluster-grid [data-cluster]").count() == 2
    assert page.locator("#cluster-grid .status-healthy").count() == 2
    assert page.locator("#spend-chart g.trace.bars").count() == 3  # aws, onprem, openai
    assert "heartbeat_timeout" in page.inner_text("main")

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=False)
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
