"""Quality services: eval sets and cases, eval runs per deployment, application feedback.

Every score lands in QualityRecord through inference.services.quality_record_create, which the
router's quality floor reads. Eval calls go through router.route(deployment=...), so they are
recorded and billed like any request; each case's call carries a client request id derived from
(run, case), so a re-delivered run task replays recorded answers instead of paying again.
Each call (a case's and its judge's) is paced under the rate limits of the run's key, its team
and the workflow, the windows /v1 counts in (inference.admission): a run waits for room rather
than calling faster than the key may.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from billing.budgets import BudgetExhausted
from inference.adapters.base import ChatMessage, ChatRequest
from inference.admission import CallTooLarge, call_limits, call_pace, job_team, request_tokens
from inference.idempotency import eval_request_id
from inference.models import Endpoint, EvalCase, EvalRun, EvalSet, InferenceRequest, QualityRecord
from inference.quality import scorers
from inference.recording.fold import bill_to_subject
from inference.router.entry import route
from inference.router.errors import RouteResult
from inference.selectors import route_plan
from inference.services import quality_record_create
from registry.claims import lease_release, row_claim
from registry.models import ApiToken, Deployment, Workflow
from registry.queues import CONTROL_QUEUE, task_send
from registry.services import RegistryError

EVAL_SET_RUN = "inference.eval_set_run"  # inference.tasks registers it under this name


def _user(user: User | AnonymousUser | None) -> User | None:
    return user if isinstance(user, User) else None


# --- Eval sets and cases ---------------------------------------------------------------------------


def eval_set_create(
    *,
    workflow: Workflow,
    name: str,
    description: str = "",
    schedule_enabled: bool = False,
    cases: list[dict[str, Any]] | None = None,
    user: User | AnonymousUser | None = None,
) -> EvalSet:
    """A new eval set with its cases (all validated, all or nothing)."""
    name = name.strip()
    if not name:
        raise RegistryError("name is required", field="name")
    if EvalSet.objects.filter(workflow=workflow, name=name).exists():
        raise RegistryError(f"workflow {workflow.slug} already has an eval set named {name!r}", field="name")
    with transaction.atomic():
        eval_set = EvalSet.objects.create(
            workflow=workflow,
            name=name,
            description=description,
            schedule_enabled=schedule_enabled,
            created_by=_user(user),
        )
        for index, case in enumerate(cases or []):
            try:
                eval_case_create(eval_set=eval_set, **case)
            except RegistryError as exc:
                raise RegistryError(f"case {index + 1}: {exc}", field="cases") from None
    return eval_set


def eval_case_create(
    *,
    eval_set: EvalSet,
    prompt: str,
    expected: str = "",
    scorer: str = EvalCase.Scorer.EXACT,
    scorer_config: dict[str, Any] | None = None,
    judge_deployment: Deployment | None = None,
    position: int | None = None,
) -> EvalCase:
    """Add a case; a bad regex, schema, number or missing judge is refused here (RegistryError)."""
    if not prompt.strip():
        raise RegistryError("prompt is required", field="prompt")
    if scorer != EvalCase.Scorer.JUDGE:
        judge_deployment = None
    elif judge_deployment is not None and not judge_deployment.enabled:
        raise RegistryError(f"judge deployment {judge_deployment.slug} is disabled", field="judge_deployment")
    config = scorers.case_config_validate(
        scorer=scorer, expected=expected, config=scorer_config, has_judge=judge_deployment is not None
    )
    if position is None:
        last = eval_set.cases.order_by("-position").values_list("position", flat=True).first()
        position = 0 if last is None else last + 1
    return EvalCase.objects.create(
        eval_set=eval_set,
        position=position,
        prompt=prompt,
        expected=expected,
        scorer=scorer,
        scorer_config=config,
        judge_deployment=judge_deployment,
    )


# --- Eval runs -----------------------------------------------------------------------------------------


def eval_run_start(
    *,
    eval_set: EvalSet,
    deployment: Deployment,
    trigger: str = EvalRun.Trigger.MANUAL,
    user: User | AnonymousUser | None = None,
    api_key: ApiToken | None = None,
    bill_to: str = "",
    enqueue: bool = True,
) -> EvalRun:
    """Queue a run of `eval_set` against `deployment` (the task starts after COMMIT). `api_key`:
    the key it was asked for with (its budgets apply, its ledger rows name it). `bill_to`: the
    ledger subject its calls are billed to ("training_run:<id>"). `enqueue=False`: the caller
    executes it itself (eval_run_execute), e.g. against a server that lives in its own process."""
    if bill_to:
        bill_to_subject(bill_to)  # ValueError on a malformed subject, before anything is written
    if not deployment.enabled:
        raise RegistryError(f"deployment {deployment.slug} is disabled", field="deployment")
    total = eval_set.cases.count()
    if total == 0:
        raise RegistryError("the eval set has no cases", field="eval_set")
    run = EvalRun.objects.create(
        eval_set=eval_set,
        deployment=deployment,
        trigger=trigger,
        cases_total=total,
        created_by=_user(user),
        api_key=api_key,
        bill_to=bill_to,
    )
    if enqueue:
        transaction.on_commit(partial(eval_run_enqueue, run_id=run.pk))
    return run


def eval_run_enqueue(*, run_id: int) -> None:
    """Send a run to its task on the control queue (by name: registry.queues.task_send)."""
    task_send(EVAL_SET_RUN, run_id, queue=CONTROL_QUEUE)


def _chat(text: str) -> ChatRequest:
    return ChatRequest(messages=(ChatMessage("user", text),), temperature=0.0)


def eval_run_execute(*, run_id: int) -> EvalRun | None:
    """Run every case of a pending run against its deployment; idempotent (claims the run first).

    A case that already has its QualityRecord in this run is skipped, so a run re-claimed after
    its worker died goes on where it stopped.
    """
    claimed = row_claim(
        EvalRun,
        pk=run_id,
        from_states=[EvalRun.State.PENDING],
        to_state=EvalRun.State.RUNNING,
        started_at=timezone.now(),
    )
    if not claimed:
        return None
    run = EvalRun.objects.select_related("eval_set__workflow__team", "deployment", "api_key__team").get(
        pk=run_id
    )
    try:
        _run_cases(run)
    except (BudgetExhausted, LookupError) as exc:
        # BudgetExhausted: fail closed. LookupError: router.NoRoute (the deployment was
        # disabled) and billing's NoPriceError (a price ended while answering).
        EvalRun.objects.filter(pk=run_id).update(
            state=EvalRun.State.FAILED, error=str(exc)[:2000], finished_at=timezone.now()
        )
        run.refresh_from_db()
        return run
    except Exception as exc:
        EvalRun.objects.filter(pk=run_id).update(
            state=EvalRun.State.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        raise
    scores = [float(s) for s in run.quality_records.values_list("score", flat=True)]
    EvalRun.objects.filter(pk=run_id).update(
        state=EvalRun.State.SUCCEEDED,
        mean_score=sum(scores) / len(scores) if scores else None,
        finished_at=timezone.now(),
    )
    run.refresh_from_db()
    return run


def _run_cases(run: EvalRun) -> None:
    workflow = run.eval_set.workflow
    done = set(run.quality_records.values_list("eval_case_id", flat=True))
    for case in run.eval_set.cases.select_related("judge_deployment").all():
        if case.pk in done:
            continue
        cost, request = Decimal("0"), None
        try:
            result = _eval_call(
                run,
                request=_chat(case.prompt),
                client_request_id=eval_request_id(run_id=run.pk, case_id=case.pk),
                deployment=run.deployment,
            )
        except CallTooLarge as exc:
            # Larger than a token limit of the key, its team or the workflow: never admitted.
            score, comment = 0.0, f"call refused: rate limit: {exc}"[:500]
        else:
            score, comment, cost = _case_score(run, case, result)
            if result.request_id:
                request = InferenceRequest.objects.filter(pk=result.request_id).first()
        with transaction.atomic():
            quality_record_create(
                deployment=run.deployment,
                score=score,
                source=QualityRecord.Source.EVAL,
                workflow=workflow,
                eval_run=run,
                eval_case=case,
                inference_request=request,
                comment=comment,
            )
            EvalRun.objects.filter(pk=run.pk).update(cases_done=F("cases_done") + 1, cost=F("cost") + cost)


def _case_score(run: EvalRun, case: EvalCase, result: RouteResult) -> tuple[float, str, Decimal]:
    """(score, comment, cost with the judge's) of a case's answer."""
    if not result.ok or result.completion is None:
        return 0.0, f"call failed: {result.error}"[:500], result.cost
    if case.scorer == EvalCase.Scorer.JUDGE:
        score, comment, judge_cost = _judge(run, case, result.completion.text)
        return score, comment, result.cost + judge_cost
    score = scorers.score_answer(
        scorer=case.scorer, expected=case.expected, config=case.scorer_config, answer=result.completion.text
    )
    return score, "", result.cost


def _eval_call(
    run: EvalRun, *, request: ChatRequest, client_request_id: str, deployment: Deployment
) -> RouteResult:
    """One call of the run: paced under its key's, team's and workflow's rate limits, then routed
    (its hard budgets are reserved there). A call answered before a crash is replayed from its
    row and costs no capacity."""
    workflow = run.eval_set.workflow
    paced = None
    if not InferenceRequest.objects.filter(client_request_id=client_request_id).exists():
        limits = call_limits(
            workflow=workflow, api_key=run.api_key, team=job_team(workflow=workflow, api_key=run.api_key)
        )
        paced = call_pace(limits=limits, tokens=request_tokens(request))
    result = route(
        workflow=workflow,
        request=request,
        endpoint=Endpoint.EVAL,
        client_request_id=client_request_id,
        deployment=deployment,
        api_key_id=run.api_key_id,
        bill_to=run.bill_to,
    )
    if paced is not None:
        c = result.completion
        paced.settle((c.tokens_in + c.tokens_out) if c is not None else 0)
    return result


def _judge(run: EvalRun, case: EvalCase, answer: str) -> tuple[float, str, Decimal]:
    judge = case.judge_deployment
    if judge is None:  # the judge deployment was removed after the case was made
        return 0.0, "no judge deployment", Decimal("0")
    prompt = scorers.judge_prompt(
        prompt=case.prompt,
        expected=case.expected,
        answer=answer,
        criteria=str(case.scorer_config.get("criteria", "")),
    )
    try:
        verdict = _eval_call(
            run,
            request=_chat(prompt),
            client_request_id=eval_request_id(run_id=run.pk, case_id=case.pk, judge=True),
            deployment=judge,
        )
    except CallTooLarge as exc:
        return 0.0, f"judge {judge.slug}: rate limit: {exc}"[:500], Decimal("0")
    if not verdict.ok or verdict.completion is None:
        return 0.0, f"judge {judge.slug} failed: {verdict.error}"[:500], verdict.cost
    value = scorers.judge_verdict(verdict.completion.text)
    if value is None:
        return 0.0, f"judge {judge.slug} gave no score: {verdict.completion.text[:200]}", verdict.cost
    return value, f"judged by {judge.slug}", verdict.cost


def eval_runs_requeue_stale(*, stale_after_s: float | None = None) -> list[int]:
    """Hand out again the runs whose worker died: running (or pending) with no progress for
    `stale_after_s` (EVAL_RUN_STALE_SECONDS, default 30 min). Progress is the newest score of the
    run; a re-claimed run skips the cases it scored and replays the calls it already paid for.
    """
    if stale_after_s is None:
        stale_after_s = settings.EVAL_RUN_STALE_SECONDS
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    requeued: list[int] = []
    candidates = EvalRun.objects.filter(state__in=[EvalRun.State.PENDING, EvalRun.State.RUNNING]).annotate(
        last_score=Max("quality_records__created_at")
    )
    for run in candidates:
        progress = max(t for t in (run.created_at, run.started_at, run.last_score) if t is not None)
        if progress >= cutoff:
            continue
        # Compare-and-set on the state and started_at read above: only one beat tick (or
        # process) re-queues a given stale state.
        if lease_release(
            EvalRun,
            pk=run.pk,
            states=[run.state],
            to_state=EvalRun.State.PENDING,
            heartbeat="started_at",
            holder={"started_at": run.started_at},
        ):
            transaction.on_commit(partial(eval_run_enqueue, run_id=run.pk))
            requeued.append(run.pk)
    return requeued


def eval_sets_scheduled() -> list[EvalRun]:
    """Beat: start a run of every scheduled eval set on every enabled deployment of its route.

    Stale runs are handed out again first (eval_runs_requeue_stale). A set and deployment with
    a run still pending or running is left alone (no pile-up when a run takes longer than the
    schedule's period).
    """
    eval_runs_requeue_stale()
    started: list[EvalRun] = []
    busy = set(
        EvalRun.objects.filter(state__in=[EvalRun.State.PENDING, EvalRun.State.RUNNING]).values_list(
            "eval_set_id", "deployment_id"
        )
    )
    for eval_set in EvalSet.objects.filter(schedule_enabled=True).select_related("workflow"):
        if not eval_set.cases.exists():
            continue
        plan = route_plan(workflow_id=eval_set.workflow_id)
        if plan is None:
            continue
        for entry in plan.entries:
            if (eval_set.pk, entry.deployment.pk) in busy:
                continue
            with transaction.atomic():
                started.append(
                    eval_run_start(
                        eval_set=eval_set, deployment=entry.deployment, trigger=EvalRun.Trigger.SCHEDULE
                    )
                )
    return started


# --- Application feedback ------------------------------------------------------------------------------


def feedback_record(
    *,
    score: Decimal | float,
    inference_request: InferenceRequest | None = None,
    deployment: Deployment | None = None,
    workflow: Workflow | None = None,
    comment: str = "",
) -> QualityRecord:
    """An application's score for an answer: by its request id, or for a deployment (+ workflow)."""
    if inference_request is not None:
        if inference_request.deployment_id is None:
            raise RegistryError(
                "that request failed on every deployment; there is no answer to score", field="request_id"
            )
        deployment = inference_request.deployment
        workflow = inference_request.workflow
    if deployment is None:
        raise RegistryError("give request_id, or deployment (and workflow)", field="deployment")
    return quality_record_create(
        deployment=deployment,
        score=score,
        source=QualityRecord.Source.FEEDBACK,
        workflow=workflow,
        inference_request=inference_request,
        comment=comment,
    )
