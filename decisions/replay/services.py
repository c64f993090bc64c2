"""Counterfactual routing: replay a workflow's kept requests through candidate deployments.

`replay_study_create` checks the question and queues it; `replay_study_execute` (the task
`decisions.replay_study_run`, on the control queue) answers it:

1. Sample: up to `sample_size` live kept requests of the workflow (inference.RetainedPrompt, newest
   first, only those kept since `sampled_since`), fixed on the study (`sampled_request_ids`) so
   every candidate answers the same requests, a resumed study the same ones again.
2. Replay: per candidate, an inference BatchJob pinned to its deployment (`route(deployment=...)`
   for every line: billed to the workflow and the study's API key, budget-checked, paced under
   the key's, team's and workflow's rate limits and the study's `max_rpm`, waiting rather than
   failing: inference.batch.pacing). Its input (the kept prompts) is written to the object store.
3. Score: each answer against the kept answer as the reference with the study's scorer
   (inference.quality.scorers: exact, contains, numeric; regex and json_schema take their pattern or
   schema from scorer_config["expected"]), or by the judge deployment (its calls billed too, with
   the judge's own idempotency keys). A request the candidate did not answer scores 0.
4. Figures (decisions.replay.figures) from ReplayResult rows whose costs are the ledger's
   (UsageRecord amounts of the replayed requests), so `cost_total` reconciles to the cent.
5. The replay's objects hold kept prompts: deleted when the study ends (succeeded or failed), and
   by the retention purge or an opt-out before then (inference.retention).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from decisions.models import ReplayCandidate, ReplayStudy
from decisions.models.replay import MAX_REPLAY_SAMPLE
from decisions.recommendations.tasks import recommendations_derive
from decisions.replay.steps import (
    StudyFailed,
    candidate_replay,
    live_kept_requests,
    study_heartbeat,
    study_paired,
    study_sample,
)
from inference.batch.jobs import stale_after
from inference.models import BatchJob
from inference.quality import scorers
from inference.retention import batch_jobs_scrub
from registry.claims import lease_release, row_claim
from registry.models import ApiToken, Deployment, Workflow
from registry.queues import CONTROL_QUEUE, task_send
from registry.selectors import workflow_current_policy
from registry.services import RegistryError

REPLAY_STUDY_RUN = "decisions.replay_study_run"  # decisions.replay.tasks registers it under this name

MAX_CANDIDATES = 10
_ACTIVE = (ReplayStudy.State.PENDING, ReplayStudy.State.RUNNING)


def _scorer_check(scorer: str, config: Any, judge: Deployment | None) -> dict[str, Any]:
    if config is not None and not isinstance(config, dict):
        raise RegistryError("scorer_config must be an object", field="scorer_config")
    config = dict(config or {})
    expected = ""
    if scorer in (scorers.REGEX, scorers.JSON_SCHEMA):
        raw = config.pop("expected", "")
        if not isinstance(raw, str) or not raw:
            raise RegistryError(
                f"the {scorer} scorer needs scorer_config.expected (the pattern or schema)",
                field="scorer_config",
            )
        expected = raw
    elif scorer != scorers.JUDGE:
        expected = "reference"  # the kept answer, known at scoring time
    checked = scorers.case_config_validate(
        scorer=scorer, expected=expected, config=config, has_judge=judge is not None
    )
    if expected and scorer in (scorers.REGEX, scorers.JSON_SCHEMA):
        checked["expected"] = expected
    return checked


def replay_study_create(
    *,
    workflow: Workflow,
    deployments: Sequence[Deployment],
    user: User | AnonymousUser | None,
    sample_size: int = 100,
    scorer: str = scorers.EXACT,
    scorer_config: dict[str, Any] | None = None,
    judge_deployment: Deployment | None = None,
    max_rpm: int | None = None,
    sampled_since: datetime | None = None,
    include_baseline: bool = True,
    api_key: ApiToken | None = None,
) -> ReplayStudy:
    """Check a replay study and queue it (after commit). RegistryError names the bad field.

    The baseline is the primary deployment of the workflow's current policy; with
    `include_baseline` it is replayed too (when not among `deployments`), so every candidate is
    compared with it on the same requests under the same conditions."""
    if not isinstance(user, User):
        raise RegistryError("a signed-in user is required", field="created_by")
    if not workflow.retain_prompts:
        raise RegistryError(
            f"workflow {workflow.slug} does not keep prompts: turn on retain_prompts to replay its traffic",
            field="workflow",
        )
    if not live_kept_requests(workflow=workflow, since=sampled_since).exists():
        raise RegistryError(f"workflow {workflow.slug} has no kept requests to replay yet", field="workflow")
    if not 1 <= sample_size <= MAX_REPLAY_SAMPLE:
        raise RegistryError(f"must be between 1 and {MAX_REPLAY_SAMPLE}", field="sample_size")
    if max_rpm is not None and max_rpm < 1:
        raise RegistryError("must be at least 1 request per minute", field="max_rpm")
    if scorer not in scorers.SCORERS:
        raise RegistryError(f"must be one of {', '.join(scorers.SCORERS)}", field="scorer")
    if scorer != scorers.JUDGE:
        judge_deployment = None
    elif judge_deployment is not None and not (
        judge_deployment.enabled and judge_deployment.provider.enabled
    ):
        raise RegistryError(f"judge deployment {judge_deployment.slug} is disabled", field="judge_deployment")
    config = _scorer_check(scorer, scorer_config, judge_deployment)
    policy = workflow_current_policy(workflow=workflow)
    primary = policy.entries.select_related("deployment").order_by("position").first() if policy else None
    baseline = primary.deployment if primary is not None else None
    chosen = list(deployments)
    if include_baseline and baseline is not None and baseline not in chosen:
        chosen.insert(0, baseline)
    if not chosen:
        raise RegistryError("name at least one candidate deployment", field="deployments")
    if len(chosen) > MAX_CANDIDATES:
        raise RegistryError(f"at most {MAX_CANDIDATES} candidates (the baseline counts)", field="deployments")
    if len({d.pk for d in chosen}) != len(chosen):
        raise RegistryError("a deployment appears twice", field="deployments")
    for d in chosen:
        if not (d.enabled and d.provider.enabled):
            raise RegistryError(f"deployment {d.slug} is disabled", field="deployments")
    with transaction.atomic():
        study = ReplayStudy.objects.create(
            workflow=workflow,
            policy_version=policy,
            baseline_deployment=baseline,
            sample_size=sample_size,
            sampled_since=sampled_since,
            scorer=scorer,
            scorer_config=config,
            judge_deployment=judge_deployment,
            max_rpm=max_rpm,
            created_by=user,
            api_key=api_key,
        )
        ReplayCandidate.objects.bulk_create([ReplayCandidate(study=study, deployment=d) for d in chosen])
        transaction.on_commit(lambda: replay_study_enqueue(study_id=study.pk))
    return study


def replay_study_enqueue(*, study_id: int) -> None:
    """Run a study on the control queue (by name: registry.queues.task_send)."""
    task_send(REPLAY_STUDY_RUN, study_id, queue=CONTROL_QUEUE)


def _claim(study_id: int) -> bool:
    """A pending study only: a stale running one is handed back to pending by the resume sweep
    first (it also checks the study's batch leases), so a duplicate delivery never takes over."""
    now = timezone.now()
    return row_claim(
        ReplayStudy,
        pk=study_id,
        from_states=[ReplayStudy.State.PENDING],
        to_state=ReplayStudy.State.RUNNING,
        started_at=Coalesce("started_at", now),
        updated_at=now,
    )


def replay_studies_resume() -> list[int]:
    """Beat: hand out again the studies whose runner died. A running study is stale when its
    heartbeat is older than INFERENCE_BATCH_STALE_SECONDS and none of its replay batch jobs holds
    a fresh lease; it goes back to pending (compare-and-set on the heartbeat) and is queued, and
    the new runner resumes it: the sample is fixed, finished batch jobs are read again, a
    half-done one resumes under its lease, results are upserted and judge calls answered from
    their recorded rows, so nothing is billed twice. Pending studies whose message was lost
    are queued again too."""
    cutoff = timezone.now() - stale_after()
    resumed: list[int] = []
    busy_jobs = BatchJob.objects.filter(state=BatchJob.State.RUNNING, updated_at__gte=cutoff)
    stale = ReplayStudy.objects.filter(state__in=_ACTIVE, updated_at__lt=cutoff).exclude(
        candidates__batch_job__in=busy_jobs
    )
    for study_id, token in stale.values_list("pk", "updated_at"):
        moved = lease_release(
            ReplayStudy,
            pk=study_id,
            states=_ACTIVE,
            to_state=ReplayStudy.State.PENDING,
            heartbeat="updated_at",
            holder={"updated_at": token},
        )
        if moved:
            resumed.append(study_id)
            transaction.on_commit(lambda pk=study_id: replay_study_enqueue(study_id=pk))  # type: ignore[misc]
    return resumed


def replay_study_execute(*, study_id: int) -> ReplayStudy | None:
    """Run a pending study (claimed with a conditional UPDATE: a second delivery does nothing)."""
    if not _claim(study_id):
        return None
    study = ReplayStudy.objects.select_related("workflow", "judge_deployment__provider", "created_by").get(
        pk=study_id
    )
    try:
        kept = study_sample(study)
        for candidate in study.candidates.select_related("deployment", "batch_job").order_by("pk"):
            study_heartbeat(study)
            candidate_replay(study, candidate, kept)
        study_paired(study)
    except StudyFailed as exc:
        return _finish(study, ReplayStudy.State.FAILED, str(exc))
    except Exception as exc:
        # A poison study fails visibly; its objects are deleted all the same.
        _finish(study, ReplayStudy.State.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    return _finish(study, ReplayStudy.State.SUCCEEDED, "")


def _finish(study: ReplayStudy, state: str, error: str) -> ReplayStudy:
    # The replay's objects hold kept prompts: they go now, whatever the outcome.
    batch_jobs_scrub(jobs=BatchJob.objects.filter(replay_candidate__study=study))
    finished = ReplayStudy.objects.filter(pk=study.pk, state=ReplayStudy.State.RUNNING).update(
        state=state, error=error[:2000], finished_at=timezone.now()
    )
    if finished and state == ReplayStudy.State.SUCCEEDED:
        # The study's verdict: recommendations, derived once its ledger rows are all written.
        transaction.on_commit(partial(recommendations_derive.delay, study.pk))
    study.refresh_from_db()
    return study
