"""Eval runs executed by a real control worker: on demand through the API, and by beat's schedule."""

from __future__ import annotations

import pytest
from django.db import close_old_connections

from bench.mockprovider import Behaviour, MockProviderServer
from inference.models import EvalRun, QualityRecord
from inference.quality import services as quality
from registry.auth.roles import Role
from tests.factories import api_client, make_user
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until

pytestmark = pytest.mark.integration


def _finished_runs(eval_set_id: int, trigger: str) -> list[EvalRun] | None:
    close_old_connections()
    runs = list(EvalRun.objects.filter(eval_set_id=eval_set_id, trigger=trigger))
    done = [r for r in runs if r.state in (EvalRun.State.SUCCEEDED, EvalRun.State.FAILED)]
    return done or None


def test_eval_runs_on_the_control_worker_on_demand_and_on_schedule(processes: Processes) -> None:
    server = MockProviderServer(Behaviour(text="Paris")).start()
    try:
        operator = make_user(Role.OPERATOR)
        deployment = priced_deployment(server)
        workflow = routed_workflow(operator, [deployment])
        eval_set = quality.eval_set_create(
            workflow=workflow,
            name="capitals",
            schedule_enabled=True,
            cases=[
                {"prompt": "Capital of France?", "expected": "Paris", "scorer": "exact"},
                {"prompt": "Capital of Peru?", "expected": "Lima", "scorer": "contains"},
            ],
        )
        processes.start("control", "worker", "--control", "--loglevel", "warning")

        response = api_client(operator).post(
            "/api/eval-runs/", {"eval_set": eval_set.pk, "deployment": deployment.slug}, format="json"
        )
        assert response.status_code == 201, response.content
        runs = wait_until(
            lambda: _finished_runs(eval_set.pk, EvalRun.Trigger.MANUAL),
            timeout=120,
            what="the on-demand eval run\n" + processes.log("control"),
        )
        run = runs[0]
        assert run.state == EvalRun.State.SUCCEEDED, run.error
        assert (run.cases_done, run.mean_score) == (2, 0.5)
        assert QualityRecord.objects.filter(eval_run=run, source=QualityRecord.Source.EVAL).count() == 2

        processes.start(
            "beat", "beat", "--loglevel", "warning", env={"SWITCHYARD_EVAL_SCHEDULE_SECONDS": "10"}
        )
        scheduled = wait_until(
            lambda: _finished_runs(eval_set.pk, EvalRun.Trigger.SCHEDULE),
            timeout=120,
            what="a scheduled eval run\n" + processes.log("beat") + processes.log("control"),
        )
        assert scheduled[0].state == EvalRun.State.SUCCEEDED, scheduled[0].error
        assert scheduled[0].deployment_id == deployment.pk and scheduled[0].mean_score == 0.5
    finally:
        server.stop()
