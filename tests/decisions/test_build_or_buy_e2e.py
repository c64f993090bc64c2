"""Build or buy end to end: a tiny byte-GPT run with the build_or_buy option, a real control
worker, and two loopback API providers (a cheap weaker one, a dear better one).

The run registers versions every 2 global versions; the worker serves each version in-process,
scores it on the workflow's eval set (an eval run billed to the run), scores both APIs once, and
ends the run by its stop rule because the cheaper API's quality is already met. The panel shows
the curve and the break-even, and the run's spend holds every evaluation ledger row to the cent.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import UsageRecord
from decisions.buildbuy.selectors import build_or_buy_report
from decisions.models import ApiScore, VersionEvaluation, VersionScore
from inference.models import EvalRun
from inference.quality import services as quality
from registry.auth.roles import Role
from registry.models import Cluster
from tests.factories import api_client, make_cluster, make_user, tiny_run_config
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until
from training import orchestrator, services
from training.models import GlobalVersionRecord, ModelVersion, TrainingLearner, TrainingRun

pytestmark = pytest.mark.integration


@pytest.fixture
def processes(transactional_db: Any, tmp_path: Path) -> Any:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(autouse=True)
def _run_object_store(tmp_path: Path, settings: Any) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}"


def _reached(run: TrainingRun) -> int:
    newest: dict[int, int] = {}
    for f, v in GlobalVersionRecord.objects.filter(run=run).values_list("fragment", "version"):
        newest[f] = max(v, newest.get(f, 0))
    return min(newest.values(), default=0)


def _train_until(run: TrainingRun, version: int) -> None:
    """Chunks on every learner, then a syncer tick, in this process (tests/training/test_run_lineage)."""
    for seq in range(20):
        for learner in TrainingLearner.objects.filter(run=run).order_by("index"):
            orchestrator.learner_chunk_execute(
                learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
            )
        run.refresh_from_db()
        orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
        if _reached(run) >= version:
            return
    raise AssertionError(f"run {run.pk} did not reach version {version}")


def _all_scored(run_id: int) -> list[VersionEvaluation] | None:
    close_old_connections()
    run = TrainingRun.objects.get(pk=run_id)
    versions = ModelVersion.objects.filter(run_id=run_id)
    evaluations = list(VersionEvaluation.objects.filter(run_id=run_id))
    done = [
        e
        for e in evaluations
        if e.state in (VersionEvaluation.State.SUCCEEDED, VersionEvaluation.State.FAILED)
    ]
    if any(e.state == VersionEvaluation.State.FAILED for e in evaluations):
        return evaluations  # the assertions below show why
    finished = run.state in TrainingRun.FINAL_STATES and versions.filter(final=True).exists()
    return evaluations if finished and len(done) == versions.count() else None


def test_versions_are_scored_against_two_apis_billed_to_the_run_and_the_stop_rule_ends_it(
    processes: Processes, tmp_path: Path
) -> None:
    cheap_server = MockProviderServer(Behaviour(text="Lyon")).start()
    dear_server = MockProviderServer(Behaviour(text="Paris")).start()
    try:
        operator = make_user(Role.OPERATOR)
        cheap = priced_deployment(cheap_server, in_price=Decimal("1"), out_price=Decimal("3"))
        dear = priced_deployment(dear_server, in_price=Decimal("10"), out_price=Decimal("30"))
        workflow = routed_workflow(operator, [cheap, dear])
        eval_set = quality.eval_set_create(
            workflow=workflow,
            name="capitals",
            cases=[
                # Any answer passes the first case; only "Paris" passes the second: the byte
                # GPT and the cheap API score 0.5, the dear API 1.0.
                {"prompt": "Say something.", "expected": r"[\s\S]", "scorer": "regex"},
                {"prompt": "Capital of France?", "expected": "Paris", "scorer": "contains"},
            ],
        )
        for price in ("1.250000", "3.000000"):
            c = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
            Cluster.objects.filter(pk=c.pk).update(status="healthy", last_heartbeat_at=timezone.now())
        # Serving is priced low enough that owning beats buying at some volume, however long
        # the eval took on a loaded machine.
        serve = make_cluster(price=Decimal("0.003600"))
        config = tiny_run_config(
            register_every_versions=2,
            build_or_buy={
                "workflows": [workflow.slug],
                "serve_cluster": serve.slug,
                "volume_tokens_per_month": 50_000_000,
                "horizon_months": 12,
                "target_quality": "cheapest_api",
                "stop_when_buying_cheaper": False,
            },
        )
        run = services.training_run_create(config=config, created_by=operator, name="build-or-buy")
        services.training_run_place(run_id=run.pk)
        run.refresh_from_db()
        assert run.state == TrainingRun.State.RUNNING, run.reason
        _train_until(run, 4)  # versions 2 and 4 registered: each queued for scoring on commit
        assert ModelVersion.objects.filter(run=run).count() >= 2
        assert VersionEvaluation.objects.filter(run=run, state=VersionEvaluation.State.PENDING).count() >= 2

        processes.start(
            "control",
            "worker",
            "--control",
            "--loglevel",
            "warning",
            env={"OBJECT_STORE_URL": f"file://{tmp_path}"},
        )
        try:
            evaluations = wait_until(lambda: _all_scored(run.pk), timeout=150, what="every version scored")
        except AssertionError:
            state = list(VersionEvaluation.objects.filter(run=run).values_list("state", "error"))
            raise AssertionError(f"{state}\n{processes.log('control')}") from None
        run.refresh_from_db()
        assert all(e.state == VersionEvaluation.State.SUCCEEDED for e in evaluations), [
            (e.model_version_id, e.error) for e in evaluations
        ]
        # The stop rule ended it: succeeded, final version registered, the reason names the rule.
        assert run.state == TrainingRun.State.SUCCEEDED
        assert "stopped by rule: build_or_buy target_quality cheapest_api met" in run.reason, run.reason
        assert cheap.slug in run.reason
        assert ModelVersion.objects.filter(run=run, final=True).count() == 1

        # Each version was served as its own self-hosted deployment on the serve cluster and
        # scored on the eval set, as an eval run billed to the run.
        for evaluation in evaluations:
            assert evaluation.deployment is not None and evaluation.deployment.hosting_cluster_id == serve.pk
            assert evaluation.deployment.model_id == run.registered_model_id
            assert (
                evaluation.deployment.base_url.startswith("http://127.0.0.1:")
                and not evaluation.deployment.enabled
            )
            assert evaluation.tokens_served > 0 and evaluation.hosting_cost > 0
            (score,) = VersionScore.objects.filter(evaluation=evaluation)
            assert score.eval_set_id == eval_set.pk
            assert score.eval_run.state == EvalRun.State.SUCCEEDED and score.eval_run.cases_done == 2
            assert score.eval_run.bill_to == f"training_run:{run.pk}"
        # Both APIs scored once for the run, billed to it as well.
        apis = {a.deployment_id: a for a in ApiScore.objects.filter(run=run)}
        assert set(apis) == {cheap.pk, dear.pk} and not any(a.reused for a in apis.values())
        assert {a.eval_run.bill_to for a in apis.values()} == {f"training_run:{run.pk}"}

        report = build_or_buy_report(run=run)
        (wf,) = report["workflows"]
        by_slug = {a["deployment"]: a for a in wf["apis"]}
        assert (by_slug[cheap.slug]["quality"], by_slug[dear.slug]["quality"]) == ("0.5000", "1.0000")
        # Price book blended by the eval's token mix (the mock answers 7 in, 3 out).
        assert by_slug[cheap.slug]["price_per_1m_tokens"] == "1.600000"
        assert by_slug[dear.slug]["price_per_1m_tokens"] == "16.000000"
        assert by_slug[cheap.slug]["cost_per_request"] == "0.000016000"
        assert wf["best_api"] == dear.slug and wf["compared_api"] == cheap.slug
        assert len(wf["points"]) == len(evaluations)
        assert all(p["quality"] == "0.5000" for p in wf["points"])
        assert wf["break_even_tokens_per_month"] is not None and wf["break_even_tokens_per_month"] > 0
        scored = [v for v in report["versions"] if v["hosting_per_1m"]]
        assert len(scored) == len(evaluations)
        assert all(Decimal(v["amortised_per_1m"]) > Decimal(v["hosting_per_1m"]) for v in scored)

        # The ledger: the run's spend is every row billed to it, and its evaluation part is
        # exactly the eval runs' billed cost plus the hosting time, to the cent and beyond.
        rows = UsageRecord.objects.filter(subject_type="training_run", subject_id=str(run.pk))
        assert Decimal(report["run_spend"]) == rows.aggregate(s=Sum("amount"))["s"]
        billed_evals = EvalRun.objects.filter(bill_to=f"training_run:{run.pk}")
        assert billed_evals.count() == len(evaluations) + 2
        eval_cost = billed_evals.aggregate(s=Sum("cost"))["s"]
        hosting = sum((e.hosting_cost for e in evaluations), Decimal(0))
        assert Decimal(report["evaluation_spend"]) == eval_cost + hosting
        assert eval_cost > 0 and Decimal(report["training_spend"]) > 0

        # The run page shows the panel; the API answers the same report, team-scoped like runs.
        client = Client()
        client.force_login(operator)
        page = client.get(f"/training/{run.pk}/").content.decode()
        assert 'id="build-or-buy-chart"' in page and "Quality against money spent" in page
        assert f"{wf['break_even_tokens_per_month']} tokens/month" in page
        assert "stopped by rule" in page
        answer = api_client(operator).get(f"/api/decisions/training-runs/{run.pk}/build-or-buy/")
        assert answer.status_code == 200, answer.content
        assert answer.json()["run_spend"] == report["run_spend"]
        assert (
            api_client(make_user(Role.VIEWER))
            .get(f"/api/decisions/training-runs/{run.pk}/build-or-buy/")
            .status_code
            == 403
        )
    finally:
        cheap_server.stop()
        dear_server.stop()
