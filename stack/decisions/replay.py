"""Counterfactual routing: replay a workflow's kept requests through candidate deployments.

`replay_study_create` checks the question and queues it; `replay_study_execute` (the task
`decisions.replay_study_run`, on the control queue) answers it:

1. Sample: up to `sample_size` live kept requests of the workflow (inference.RetainedPrompt, newest
   first, only those kept since `sampled_since`), fixed on the study (`sampled_request_ids`) so
   every candidate answers the same requests, a resumed study the same ones again.
2. Replay: per candidate, an inference BatchJob pinned to its deployment (`route(deployment=...)`
   for every line: billed to the workflow and the study's API key, budget-checked, paced under
   the key's, team's and workflow's rate limits and the study's `max_rpm`, waiting rather than
   failing: inference.batch_pacing). Its input (the kept prompts) is written to the object store.
3. Score: each answer against the kept answer as the reference with the study's scorer
   (inference.scorers: exact, contains, numeric; regex and json_schema take their pattern or
   schema from scorer_config["expected"]), or by the judge deployment (its calls billed too, with
   the judge's own idempotency keys). A request the candidate did not answer scores 0.
4. Figures (stack.decisions.replay_figures) from ReplayResult rows whose costs are the ledger's
   (UsageRecord amounts of the replayed requests), so `cost_total` reconciles to the cent.
5. The replay's objects hold kept prompts: deleted when the study ends (succeeded or failed), and
   by the retention purge or an opt-out before then (inference.retention).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.budgets import BudgetExhausted
from billing.models import UsageRecord
from inference import scorers
from inference.adapters.base import ChatMessage, ChatRequest
from inference.admission import CallTooLarge, call_pace, request_tokens
from inference.batch import batch_job_create, batch_job_execute, stale_after
from inference.batch_pacing import batch_limits
from inference.idempotency import replay_judge_request_id
from inference.models import BatchJob, Endpoint, InferenceRequest, RetainedPrompt
from inference.recording import journal_fold_all
from inference.retention import batch_jobs_scrub
from inference.router import CapabilityMissing, CostLimitExceeded, NoRoute, route
from stack.decisions.models import ReplayCandidate, ReplayResult, ReplayStudy
from stack.decisions.models.replay import MAX_REPLAY_SAMPLE
from stack.decisions.recommendation_selectors import replay_ledger_cost
from stack.decisions.recommendation_tasks import recommendations_derive
from stack.decisions.replay_figures import candidate_figures, paired_figures
from stack.registry.models import ApiToken, Deployment, Workflow
from stack.registry.objectstore import default_store
from stack.registry.queues import CONTROL_QUEUE
from stack.registry.selectors import workflow_current_policy
from stack.registry.services import RegistryError

MAX_CANDIDATES = 10
LEDGER_WAIT_S = 120.0  # how long a study waits for other folders to commit its requests' rows
_ACTIVE = (ReplayStudy.State.PENDING, ReplayStudy.State.RUNNING)
# Scorers whose reference is the kept answer; the others bring theirs in scorer_config.
_REFERENCE_IS_KEPT_ANSWER = (scorers.EXACT, scorers.CONTAINS, scorers.NUMERIC, scorers.JUDGE)


def live_kept_requests(
    *, workflow: Workflow, since: datetime | None = None, now: datetime | None = None
) -> Any:
    """The workflow's kept requests that have not expired (newest first)."""
    rows = RetainedPrompt.objects.filter(workflow=workflow, expires_at__gt=now or timezone.now())
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    return rows.order_by("-created_at", "-pk")


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
    from stack.decisions.tasks import replay_study_run  # noqa: PLC0415 (the task module imports this one)

    replay_study_run.apply_async(args=(study_id,), queue=CONTROL_QUEUE)


def _claim(study_id: int) -> bool:
    now = timezone.now()
    return bool(
        ReplayStudy.objects.filter(pk=study_id, state=ReplayStudy.State.PENDING).update(
            state=ReplayStudy.State.RUNNING, started_at=Coalesce("started_at", now), updated_at=now
        )
    )


def _beat(study: ReplayStudy) -> None:
    ReplayStudy.objects.filter(pk=study.pk, state=ReplayStudy.State.RUNNING).update(updated_at=timezone.now())


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
        moved = ReplayStudy.objects.filter(pk=study_id, state__in=_ACTIVE, updated_at=token).update(
            state=ReplayStudy.State.PENDING, updated_at=timezone.now()
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
        kept = _sample(study)
        for candidate in study.candidates.select_related("deployment", "batch_job").order_by("pk"):
            _beat(study)
            _replay_candidate(study, candidate, kept)
        _paired(study)
    except _StudyFailed as exc:
        return _finish(study, ReplayStudy.State.FAILED, str(exc))
    except Exception as exc:
        # A poison study fails visibly; its objects are deleted all the same.
        _finish(study, ReplayStudy.State.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    return _finish(study, ReplayStudy.State.SUCCEEDED, "")


class _StudyFailed(Exception):
    pass


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


def _sample(study: ReplayStudy) -> dict[int, RetainedPrompt]:
    """The kept requests of the study, by request id (sampled once, then fixed)."""
    if not study.sampled_request_ids:
        ids = list(
            live_kept_requests(workflow=study.workflow, since=study.sampled_since).values_list(
                "inference_request_id", flat=True
            )[: study.sample_size]
        )
        if not ids:
            raise _StudyFailed("no kept requests to replay (they expired or the workflow opted out)")
        ReplayStudy.objects.filter(pk=study.pk).update(sampled_request_ids=ids)
        study.sampled_request_ids = ids
    rows = RetainedPrompt.objects.filter(
        inference_request_id__in=study.sampled_request_ids, expires_at__gt=timezone.now()
    )
    kept = {row.inference_request_id: row for row in rows}
    if not kept:
        raise _StudyFailed("the sampled kept requests expired before they were replayed")
    return kept


def _custom_id(request_id: int) -> str:
    return f"req-{request_id}"


def _replay_candidate(
    study: ReplayStudy, candidate: ReplayCandidate, kept: dict[int, RetainedPrompt]
) -> None:
    order = [r for r in study.sampled_request_ids if r in kept]
    job = candidate.batch_job
    if job is None:
        lines = "".join(
            json.dumps({"custom_id": _custom_id(r), **kept[r].request}, separators=(",", ":")) + "\n"
            for r in order
        )
        holds_until = min(kept[r].expires_at for r in order)
        try:
            job = batch_job_create(
                workflow=study.workflow,
                user=study.created_by,
                input_jsonl=lines,
                api_key=study.api_key,
                deployment=candidate.deployment,
                max_rpm=study.max_rpm,
                holds_prompts_until=holds_until,
                enqueue=False,  # run here, one candidate after the other, off the request path
            )
        except RegistryError as exc:
            raise _StudyFailed(f"candidate {candidate.deployment.slug}: {exc}") from None
        ReplayCandidate.objects.filter(pk=candidate.pk).update(batch_job=job)
        candidate.batch_job = job
    while True:
        batch_job_execute(job_id=job.pk)  # runs, resumes a stale lease, or finds it finished
        job.refresh_from_db()
        if job.state != BatchJob.State.RUNNING:
            break
        # Another runner holds the lease (the batch resume task took it after a crash): its
        # lines are billed once either way; wait for it, or for its lease to go stale.
        _beat(study)
        time.sleep(1.0)
    if job.state != BatchJob.State.SUCCEEDED:
        raise _StudyFailed(f"the replay on {candidate.deployment.slug} {job.state}: {job.error}")
    records = [json.loads(raw) for raw in default_store().get(job.output_uri).splitlines() if raw.strip()]
    _results_write(study, candidate, kept, records)
    _figures_write(candidate)


def _ledger_settled(request_ids: Sequence[int]) -> None:
    """Journaled replays: fold their entries now. A folder thread of this process (or another)
    may hold some of them (SKIP LOCKED) in a fold not yet committed: wait for it, so the costs
    read next are the ledger's final ones."""
    waiting = InferenceRequest.objects.filter(pk__in=list(request_ids), ledger_pending__isnull=False).exclude(
        ledger_pending__has_key="error"  # a failed fold waits for an operator: it has no ledger rows
    )
    for _ in range(int(LEDGER_WAIT_S / 0.05)):
        journal_fold_all()
        if not waiting.exists():
            return
        time.sleep(0.05)
    raise _StudyFailed("the replayed requests' ledger rows are still being written; run the study again")


def _ledger_costs(request_ids: Sequence[int]) -> dict[int, Decimal]:
    """The ledger's amount per inference request (its usage records; 0 for none)."""
    _ledger_settled(request_ids)
    rows = (
        UsageRecord.objects.filter(
            subject_type="inference_request", subject_id__in=[str(r) for r in request_ids]
        )
        .values("subject_id")
        .annotate(total=Sum("amount"))
    )
    return {int(row["subject_id"]): row["total"] for row in rows}


def _kept_text(kept: RetainedPrompt) -> str:
    request = kept.request
    if "prompt" in request:
        return str(request["prompt"])
    parts = []
    for message in request.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', 'user')}: {content or ''}")
    return "\n".join(parts)


def _score(
    study: ReplayStudy, candidate: ReplayCandidate, kept: RetainedPrompt, answer: str
) -> tuple[Decimal, str, InferenceRequest | None]:
    """(score, error, the judge's request)."""
    config = dict(study.scorer_config)
    if study.scorer != scorers.JUDGE:
        reference = (
            kept.response_text if study.scorer in _REFERENCE_IS_KEPT_ANSWER else config.pop("expected", "")
        )
        value = scorers.score_answer(scorer=study.scorer, expected=reference, config=config, answer=answer)
        return Decimal(repr(value)).quantize(Decimal("0.0001")), "", None
    judge = study.judge_deployment
    if judge is None:
        return Decimal(0), "no judge deployment", None
    prompt = scorers.judge_prompt(
        prompt=_kept_text(kept),
        expected=kept.response_text,
        answer=answer,
        criteria=str(config.get("criteria", "")),
    )
    request = ChatRequest(messages=(ChatMessage("user", prompt),), temperature=0.0)
    judge_key = replay_judge_request_id(candidate_id=candidate.pk, request_id=kept.inference_request_id)
    try:
        if (
            candidate.batch_job is not None
            and not InferenceRequest.objects.filter(client_request_id=judge_key).exists()
        ):
            # The judge's calls count against the same limits and pace as the replay's lines
            # (a call answered before a crash is replayed from its row and costs no capacity).
            paced = call_pace(limits=batch_limits(candidate.batch_job), tokens=request_tokens(request))
        else:
            paced = None
        verdict = route(
            workflow=study.workflow,
            request=request,
            endpoint=Endpoint.EVAL,
            client_request_id=judge_key,
            deployment=judge,
            api_key_id=study.api_key_id,
        )
    except (CostLimitExceeded, CapabilityMissing, NoRoute, CallTooLarge, BudgetExhausted) as exc:
        return Decimal(0), f"judge {judge.slug}: {exc}"[:500], None
    if paced is not None:
        c = verdict.completion
        paced.settle((c.tokens_in + c.tokens_out) if c is not None else 0)
    row = InferenceRequest.objects.filter(pk=verdict.request_id).first() if verdict.request_id else None
    if not verdict.ok or verdict.completion is None:
        return Decimal(0), f"judge {judge.slug} failed: {verdict.error}"[:500], row
    judged = scorers.judge_verdict(verdict.completion.text)
    if judged is None:
        return Decimal(0), f"judge {judge.slug} gave no score"[:500], row
    return Decimal(repr(judged)).quantize(Decimal("0.0001")), "", row


def _results_write(
    study: ReplayStudy,
    candidate: ReplayCandidate,
    kept: dict[int, RetainedPrompt],
    records: list[dict[str, Any]],
) -> None:
    by_original: dict[int, dict[str, Any]] = {}
    for record in records:
        custom = str(record.get("custom_id") or "")
        if custom.startswith("req-"):
            by_original[int(custom[4:])] = record
    results: dict[int, tuple[ReplayResult, int | None]] = {}
    for original_id, record in by_original.items():
        row = kept.get(original_id)
        replay_id = record.get("request_id")
        response = record.get("response")
        ok = record.get("error") is None and response is not None
        score, error, judge_row = Decimal(0), str(record.get("error") or "")[:500], None
        if row is not None and ok and response is not None:
            # A judge call made before a crash is answered from its recorded row (its
            # idempotency key), not called nor billed again.
            score, score_error, judge_row = _score(study, candidate, row, str(response.get("text") or ""))
            error = error or score_error
        _beat(study)
        result, _ = ReplayResult.objects.update_or_create(
            candidate=candidate,
            original_request_id=original_id,
            defaults={
                "retained_prompt": row,
                "replay_request_id": replay_id,
                "ok": ok,
                "score": score,
                "error": error,
                **({"judge_request": judge_row} if judge_row is not None else {}),
            },
        )
        results[original_id] = (result, replay_id)
    replay_ids = [r for _, r in results.values() if r is not None]
    judge_ids = list(
        ReplayResult.objects.filter(candidate=candidate, judge_request__isnull=False).values_list(
            "judge_request_id", flat=True
        )
    )
    costs = _ledger_costs([*replay_ids, *judge_ids])
    latency = dict(InferenceRequest.objects.filter(pk__in=replay_ids).values_list("pk", "latency_ms"))
    for result, replay_id in results.values():
        result.cost = costs.get(replay_id, Decimal(0)) if replay_id is not None else Decimal(0)
        result.latency_ms = latency.get(replay_id) if result.ok and replay_id is not None else None  # type: ignore[assignment]
        result.judge_cost = (
            costs.get(result.judge_request_id, Decimal(0)) if result.judge_request_id else Decimal(0)
        )
    ReplayResult.objects.bulk_update([r for r, _ in results.values()], ["cost", "latency_ms", "judge_cost"])


def _figures_write(candidate: ReplayCandidate) -> None:
    results = list(candidate.results.filter(replay_request__isnull=False))
    figures = candidate_figures(
        costs=[r.cost for r in results],
        scores=[r.score if r.score is not None else Decimal(0) for r in results],
        latencies_ms=[r.latency_ms for r in results if r.ok and r.latency_ms is not None],
        succeeded=sum(1 for r in results if r.ok),
    )
    currency = (
        InferenceRequest.objects.filter(pk__in=[r.replay_request_id for r in results[:1]])
        .values_list("currency", flat=True)
        .first()
    )
    ReplayCandidate.objects.filter(pk=candidate.pk).update(
        requests=figures.requests,
        succeeded=figures.succeeded,
        cost_total=figures.cost_total,
        currency=currency or "USD",
        cost_per_request=figures.cost_per_request,
        cost_per_request_ci=figures.cost_per_request_ci,
        cost_per_1m_requests=figures.cost_per_1m_requests,
        quality_mean=figures.quality_mean,
        quality_ci=figures.quality_ci,
        latency_p50_ms=figures.latency_p50_ms,
        latency_p95_ms=figures.latency_p95_ms,
        latency_p95_ci_ms=figures.latency_p95_ci_ms,
        judge_cost_total=sum((r.judge_cost for r in candidate.results.all()), Decimal(0)),
    )


def _paired(study: ReplayStudy) -> None:
    """Each candidate against the baseline deployment on the same kept requests."""
    candidates = list(study.candidates.all())
    base = next((c for c in candidates if c.deployment_id == study.baseline_deployment_id), None)
    if base is None:
        return

    def pairs(candidate: ReplayCandidate) -> dict[int, tuple[Decimal, Decimal]]:
        rows = candidate.results.filter(replay_request__isnull=False).values_list(
            "original_request_id", "cost", "score"
        )
        return {r: (cost, score if score is not None else Decimal(0)) for r, cost, score in rows}

    baseline = pairs(base)
    for candidate in candidates:
        if candidate.pk == base.pk:
            continue
        paired = paired_figures(candidate=pairs(candidate), baseline=baseline)
        ReplayCandidate.objects.filter(pk=candidate.pk).update(
            paired_requests=paired.pairs,
            cost_delta_per_request=paired.cost_delta,
            cost_delta_ci=paired.cost_delta_ci,
            quality_delta=paired.quality_delta,
            quality_delta_ci=paired.quality_delta_ci,
        )


def replay_ledger_total(*, candidate: ReplayCandidate) -> Decimal:
    """The ledger's sum for a candidate's replayed requests (what cost_total must equal): the
    same sum a recommendation's figures are checked against."""
    return replay_ledger_cost(candidate=candidate).amount
