"""The steps of answering a replay study, in order: sample the kept requests (study_sample), replay
them through each candidate as a batch job and score the answers (candidate_replay), and write
the paired figures (study_paired). decisions.replay.services claims the study and runs them."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Sum
from django.utils import timezone

from billing.budgets import BudgetExhausted
from billing.models import UsageRecord
from decisions.models import ReplayCandidate, ReplayResult, ReplayStudy
from decisions.recommendations.selectors import replay_ledger_cost
from decisions.replay.figures import candidate_figures, paired_figures
from inference.adapters.base import ChatMessage, ChatRequest
from inference.admission import CallTooLarge, call_pace, request_tokens
from inference.batch.jobs import batch_job_create, batch_job_execute
from inference.batch.pacing import batch_limits
from inference.idempotency import replay_judge_request_id
from inference.models import BatchJob, Endpoint, InferenceRequest, RetainedPrompt
from inference.quality import scorers
from inference.recording import journal_fold_all
from inference.router.entry import route
from inference.router.errors import CapabilityMissing, CostLimitExceeded, NoRoute
from registry.claims import lease_renew
from registry.models import Workflow
from registry.services import RegistryError
from registry.store.objectstore import default_store

LEDGER_WAIT_S = 120.0  # how long a study waits for other folders to commit its requests' rows
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


class StudyFailed(Exception):
    pass


def study_heartbeat(study: ReplayStudy) -> None:
    """The running study's heartbeat (updated_at): replay_studies_resume takes over a stale one."""
    lease_renew(ReplayStudy, pk=study.pk, states=[ReplayStudy.State.RUNNING], heartbeat="updated_at")


def study_sample(study: ReplayStudy) -> dict[int, RetainedPrompt]:
    """The kept requests of the study, by request id (sampled once, then fixed)."""
    if not study.sampled_request_ids:
        ids = list(
            live_kept_requests(workflow=study.workflow, since=study.sampled_since).values_list(
                "inference_request_id", flat=True
            )[: study.sample_size]
        )
        if not ids:
            raise StudyFailed("no kept requests to replay (they expired or the workflow opted out)")
        ReplayStudy.objects.filter(pk=study.pk).update(sampled_request_ids=ids)
        study.sampled_request_ids = ids
    rows = RetainedPrompt.objects.filter(
        inference_request_id__in=study.sampled_request_ids, expires_at__gt=timezone.now()
    )
    kept = {row.inference_request_id: row for row in rows}
    if not kept:
        raise StudyFailed("the sampled kept requests expired before they were replayed")
    return kept


def _custom_id(request_id: int) -> str:
    return f"req-{request_id}"


def candidate_replay(study: ReplayStudy, candidate: ReplayCandidate, kept: dict[int, RetainedPrompt]) -> None:
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
            raise StudyFailed(f"candidate {candidate.deployment.slug}: {exc}") from None
        ReplayCandidate.objects.filter(pk=candidate.pk).update(batch_job=job)
        candidate.batch_job = job
    while True:
        batch_job_execute(job_id=job.pk)  # runs, resumes a stale lease, or finds it finished
        job.refresh_from_db()
        if job.state != BatchJob.State.RUNNING:
            break
        # Another runner holds the lease (the batch resume task took it after a crash): its
        # lines are billed once either way; wait for it, or for its lease to go stale.
        study_heartbeat(study)
        time.sleep(1.0)
    if job.state != BatchJob.State.SUCCEEDED:
        raise StudyFailed(f"the replay on {candidate.deployment.slug} {job.state}: {job.error}")
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
    raise StudyFailed("the replayed requests' ledger rows are still being written; run the study again")


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
        study_heartbeat(study)
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


def study_paired(study: ReplayStudy) -> None:
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
