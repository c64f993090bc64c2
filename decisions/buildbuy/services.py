"""Build or buy, the writes: serve and score each model version of a build-or-buy run, score
the API deployments it is compared with, and apply the run's stop rule.

Flow: training sends `model_version_registered` after COMMIT (training.signals); the receiver
here makes the version's VersionEvaluation and enqueues `decisions.version_evaluate` on the
control queue. The task claims the evaluation with a conditional UPDATE (pending, or a claim
older than BUILD_OR_BUY_STALE_SECONDS), loads the version's weights into an in-process
OpenAI-compatible server on loopback (inference.serving.local), points the version's
Deployment at it, runs each eval set of the run's workflows through the router as an eval run
billed to the run (EvalRun.bill_to = "training_run:<id>", so the run's spend and budgets count
it), bills the server's accelerator time on the serve cluster to the run as well, scores the
workflows' API deployments once per run (a recent succeeded eval run is reused), and then asks
the stop rule. Beat's sweep (`version_evaluations_sweep`) enqueues whatever a killed worker or a
lost signal left behind; eval runs resume where they stopped (recorded answers are replayed,
not paid again).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from billing.models import Unit
from billing.selectors import price_in_force
from billing.services import price_book_publish
from decisions.models import ApiScore, VersionEvaluation, VersionScore
from inference.models import EvalRun, EvalSet
from inference.quality import services as quality
from inference.selectors import route_plan
from inference.serving.hosting import hosting_interval_bill
from registry.claims import lease_claim
from registry.models import Cluster, Deployment, Provider, Workflow
from registry.queues import CONTROL_QUEUE, task_send
from registry.services import RegistryError
from training.models import ModelVersion, TrainingRun
from training.run_config import RunConfig
from training.services import training_run_stop_by_rule

VERSION_EVALUATE = "decisions.version_evaluate"  # decisions.buildbuy.tasks registers it under this name

logger = logging.getLogger(__name__)

RUN_SUBJECT = "training_run"
# A succeeded eval run of the same set and API deployment this recent is reused, not paid again.
API_EVAL_REUSE = timedelta(days=7)


class EvalNotScored(RuntimeError):
    """A version's eval run did not succeed; its evaluation fails with that run's error."""


def _stale_after() -> timedelta:
    return timedelta(seconds=settings.BUILD_OR_BUY_STALE_SECONDS)


def run_bill_to(run_id: int) -> str:
    """The ledger subject of a run's evaluation spend: the run itself."""
    return f"{RUN_SUBJECT}:{run_id}"


def build_or_buy_option(run: TrainingRun) -> dict[str, Any] | None:
    return RunConfig(run.config).build_or_buy


def eval_sets_of(workflow: Workflow) -> list[EvalSet]:
    """The eval sets that can score a version for `workflow` (those with cases)."""
    return list(EvalSet.objects.filter(workflow=workflow, cases__isnull=False).distinct().order_by("pk"))


# --- Requesting an evaluation ---------------------------------------------------------------------


def version_evaluation_request(*, version_id: int) -> VersionEvaluation | None:
    """The version's evaluation (made once), queued after COMMIT; None when its run has no
    build_or_buy option. Idempotent: a second call finds the row and queues nothing new unless
    it is still pending (the claim makes a duplicate message a no-op)."""
    version = ModelVersion.objects.select_related("run").filter(pk=version_id).first()
    if version is None or build_or_buy_option(version.run) is None:
        return None
    evaluation, _ = VersionEvaluation.objects.get_or_create(
        model_version=version, defaults={"run": version.run}
    )
    if evaluation.state == VersionEvaluation.State.PENDING:
        transaction.on_commit(partial(version_evaluation_enqueue, evaluation_id=evaluation.pk))
    return evaluation


def version_evaluation_enqueue(*, evaluation_id: int) -> None:
    """Score a version on the control queue (by name: registry.queues.task_send)."""
    task_send(VERSION_EVALUATE, evaluation_id, queue=CONTROL_QUEUE)


def on_model_version_registered(sender: Any, *, version_id: int, run_id: int, **kwargs: Any) -> None:
    """training.signals.model_version_registered → score the version (build-or-buy runs only)."""
    version_evaluation_request(version_id=version_id)


def version_evaluations_sweep() -> list[int]:
    """Beat: make the evaluations a lost signal never made, and queue again those a killed
    worker left (pending and not claimed for the stale limit, or claimed that long ago)."""
    now = timezone.now()
    cutoff = now - _stale_after()
    runs = TrainingRun.objects.exclude(config__build_or_buy=None).filter(config__has_key="build_or_buy")
    missing = ModelVersion.objects.filter(run__in=runs, evaluation__isnull=True).values_list("pk", flat=True)
    for version_id in list(missing):
        version_evaluation_request(version_id=version_id)
    stale = VersionEvaluation.objects.filter(
        Q(state=VersionEvaluation.State.PENDING, created_at__lt=cutoff, claimed_at__isnull=True)
        | Q(
            state__in=[VersionEvaluation.State.PENDING, VersionEvaluation.State.RUNNING],
            claimed_at__lt=cutoff,
        )
    ).values_list("pk", flat=True)
    queued = list(stale)
    for evaluation_id in queued:
        transaction.on_commit(partial(version_evaluation_enqueue, evaluation_id=evaluation_id))
    return queued


# --- Executing one ----------------------------------------------------------------------------------


def _claim(evaluation_id: int) -> bool:
    """Conditional UPDATE: pending, or running with a claim older than the stale limit."""
    token = lease_claim(
        VersionEvaluation,
        pk=evaluation_id,
        pending=VersionEvaluation.State.PENDING,
        running=VersionEvaluation.State.RUNNING,
        heartbeat="claimed_at",
        stale_after=_stale_after(),
        attempts=F("attempts") + 1,
    )
    return token is not None


def _serving_deployment(version: ModelVersion, cluster: Cluster | None, base_url: str) -> Deployment:
    """The version's deployment, pointed at `base_url` (this evaluation's loopback server).

    Its provider is its own self-hosted provider whose base URL is the server, so the outbound
    guard's endpoint rule holds for whatever port the server got; prices per token are zero
    (the accelerator time is the cost: billing.selfhosted)."""
    model = version.registered_model
    slug = f"{model.slug}-v{version.number}"[:64].strip("-")
    provider, _ = Provider.objects.get_or_create(
        slug=slug,
        defaults={
            "display_name": f"self-hosted {model.slug} v{version.number}",
            "kind": Provider.Kind.OPENAI_COMPATIBLE,
            "allow_private_network": True,
        },
    )
    provider.base_url, provider.enabled = base_url, True
    provider.save()  # save(): the route caches listen for it
    deployment, created = Deployment.objects.get_or_create(
        slug=slug,
        defaults={
            "model": model,
            "provider": provider,
            "provider_model_id": model.slug,
            "base_url": base_url,
            "hosting_cluster": cluster,
            "max_context_tokens": None,
        },
    )
    if created:
        at = deployment.created_at - timedelta(seconds=1)
        for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
            price_book_publish(
                unit=unit,
                unit_price=Decimal("0"),
                effective_from=at,
                deployment=deployment,
                currency=cluster_currency(cluster),
                note="self-hosted: billed by accelerator time",
            )
    else:
        deployment.base_url, deployment.enabled = base_url, True
        deployment.save()
    return deployment


def cluster_currency(cluster: Cluster | None) -> str:
    if cluster is None:
        return "USD"
    price = price_in_force(unit=Unit.ACCELERATOR_HOUR, at=timezone.now(), cluster=cluster)
    return price.currency if price is not None else "USD"


def _execute_eval(run: EvalRun) -> EvalRun:
    """Run an eval run in this process (its deployment may be a server of this process)."""
    if run.state == EvalRun.State.RUNNING:
        # Its claimer died with the evaluation we now hold: resume (scored cases are skipped,
        # recorded answers replayed).
        EvalRun.objects.filter(pk=run.pk, state=EvalRun.State.RUNNING).update(state=EvalRun.State.PENDING)
    quality.eval_run_execute(run_id=run.pk)
    run.refresh_from_db()
    return run


def _score_version(evaluation: VersionEvaluation, deployment: Deployment, workflows: list[Workflow]) -> None:
    bill_to = run_bill_to(evaluation.run_id)
    for workflow in workflows:
        for eval_set in eval_sets_of(workflow):
            score = (
                VersionScore.objects.filter(evaluation=evaluation, eval_set=eval_set)
                .select_related("eval_run")
                .first()
            )
            if score is None:
                with transaction.atomic():
                    eval_run = quality.eval_run_start(
                        eval_set=eval_set, deployment=deployment, bill_to=bill_to, enqueue=False
                    )
                    score = VersionScore.objects.create(
                        evaluation=evaluation, workflow=workflow, eval_set=eval_set, eval_run=eval_run
                    )
            if score.eval_run.state != EvalRun.State.SUCCEEDED:
                done = _execute_eval(score.eval_run)
                if done.state != EvalRun.State.SUCCEEDED:
                    # A partly scored version would sit on the curve at a wrong quality.
                    raise EvalNotScored(f"eval run {done.pk} on {eval_set.name!r} {done.state}: {done.error}")


def api_scores_ensure(*, run: TrainingRun, workflows: list[Workflow]) -> list[ApiScore]:
    """Each API deployment of each workflow's current route scored on each eval set, once per
    run: a succeeded eval run of the same set and deployment from the last API_EVAL_REUSE is
    reused; otherwise one is run now, billed to the run. An API that cannot be scored now (it
    was disabled) is left out of the comparison and tried again with the next version."""
    out: list[ApiScore] = []
    for workflow in workflows:
        plan = route_plan(workflow_id=workflow.pk)
        deployments = [e.deployment for e in plan.entries] if plan is not None else []
        for eval_set in eval_sets_of(workflow):
            for deployment in deployments:
                try:
                    out.append(_api_score(run, workflow, eval_set, deployment))
                except RegistryError as exc:
                    logger.warning("run %s: %s not scored on %s: %s", run.pk, deployment, eval_set.pk, exc)
    return out


def _api_score(run: TrainingRun, workflow: Workflow, eval_set: EvalSet, deployment: Deployment) -> ApiScore:
    score = ApiScore.objects.filter(run=run, eval_set=eval_set, deployment=deployment).first()
    if score is None:
        recent = (
            EvalRun.objects.filter(
                eval_set=eval_set,
                deployment=deployment,
                state=EvalRun.State.SUCCEEDED,
                finished_at__gte=timezone.now() - API_EVAL_REUSE,
            )
            .order_by("-finished_at")
            .first()
        )
        with transaction.atomic():
            eval_run = recent or quality.eval_run_start(
                eval_set=eval_set, deployment=deployment, bill_to=run_bill_to(run.pk), enqueue=False
            )
            score, _ = ApiScore.objects.get_or_create(
                run=run,
                eval_set=eval_set,
                deployment=deployment,
                defaults={"workflow": workflow, "eval_run": eval_run, "reused": recent is not None},
            )
    if score.eval_run.state == EvalRun.State.FAILED:
        # The provider failed it (down, out of budget): the next version's scoring tries a
        # fresh run rather than comparing against nothing.
        with transaction.atomic():
            score.eval_run = quality.eval_run_start(
                eval_set=eval_set, deployment=deployment, bill_to=run_bill_to(run.pk), enqueue=False
            )
            score.reused = False
            score.save(update_fields=["eval_run", "reused"])
    if score.eval_run.state != EvalRun.State.SUCCEEDED:
        _execute_eval(score.eval_run)
    return score


def version_evaluation_execute(*, evaluation_id: int) -> VersionEvaluation | None:
    """Serve, score and bill one version (the task's body); None when another worker holds it
    or it is done. Then apply the run's stop rule."""
    if not _claim(evaluation_id):
        return None
    evaluation = VersionEvaluation.objects.select_related("model_version__registered_model", "run").get(
        pk=evaluation_id
    )
    version, run = evaluation.model_version, evaluation.run
    option = build_or_buy_option(run) or {}
    workflows = list(Workflow.objects.filter(slug__in=option.get("workflows", [])).order_by("slug"))
    cluster = Cluster.objects.filter(slug=option.get("serve_cluster") or "").first()
    try:
        _serve_and_score(evaluation, version, run, workflows, cluster)
        api_scores_ensure(run=run, workflows=workflows)
    except Exception as exc:
        VersionEvaluation.objects.filter(pk=evaluation_id).update(
            state=VersionEvaluation.State.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        logger.exception("build or buy: evaluation %s of %s failed", evaluation_id, version)
        evaluation.refresh_from_db()
        return evaluation
    VersionEvaluation.objects.filter(pk=evaluation_id).update(
        state=VersionEvaluation.State.SUCCEEDED, finished_at=timezone.now(), error=""
    )
    evaluation.refresh_from_db()
    build_or_buy_stop_check(run_id=run.pk)
    return evaluation


def _serve_and_score(
    evaluation: VersionEvaluation,
    version: ModelVersion,
    run: TrainingRun,
    workflows: list[Workflow],
    cluster: Cluster | None,
) -> None:
    from inference.serving.local import local_server_for_artifact  # torch: only when serving

    server = local_server_for_artifact(uri=version.artifact_uri, name=str(version), port=0)
    host, port = server.server_address[:2]
    shown = host.decode() if isinstance(host, bytes) else host
    thread = threading.Thread(target=server.serve_forever, name=f"serve-{version.pk}", daemon=True)
    thread.start()
    started = timezone.now()
    deployment: Deployment | None = None
    try:
        deployment = _serving_deployment(version, cluster, f"http://{shown}:{port}/v1")
        VersionEvaluation.objects.filter(pk=evaluation.pk).update(deployment=deployment)
        _score_version(evaluation, deployment, workflows)
    finally:
        ended = timezone.now()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        # Its server is gone: nothing may route to the dead port (the next scoring re-enables it).
        if deployment is not None:
            deployment.enabled = False
            deployment.save(update_fields=["enabled"])  # save(): the route caches listen for it
    # The accelerator time held while the version answered its evals, on the serve cluster, at
    # that cluster's accelerator-hour price, billed to the run (it is part of what training cost).
    seconds = Decimal(str(round((ended - started).total_seconds(), 3)))
    cost = Decimal("0")
    if cluster is not None and deployment is not None:
        row = hosting_interval_bill(
            deployment=deployment,
            started_at=started,
            ended_at=ended,
            bill_to=(RUN_SUBJECT, str(run.pk)),
            team=run.team_slug,
        )
        cost = row.amount if row is not None else Decimal("0")
    tokens = sum(
        (r.eval_run.quality_records.aggregate(t=_TOKENS)["t"] or 0)
        for r in VersionScore.objects.filter(evaluation=evaluation).select_related("eval_run")
    )
    VersionEvaluation.objects.filter(pk=evaluation.pk).update(
        hosting_seconds=F("hosting_seconds") + seconds,
        hosting_cost=F("hosting_cost") + cost,
        tokens_served=tokens,
    )


_TOKENS = Sum(F("inference_request__tokens_in") + F("inference_request__tokens_out"))


# --- The stop rule -----------------------------------------------------------------------------------


def build_or_buy_stop_check(*, run_id: int) -> TrainingRun | None:
    """After a version is scored: end the run (succeeded) when its target quality is met on every
    workflow, or, with stop_when_buying_cheaper, when buying is cheaper at the forecast volume on
    every workflow. The reason names the rule and the figures."""
    from decisions.buildbuy.selectors import build_or_buy_report

    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return run
    report = build_or_buy_report(run=run)
    reason = report.get("stop_reason") or ""
    if not reason:
        return run
    logger.info("run %s: %s", run_id, reason)
    return training_run_stop_by_rule(run_id=run_id, reason=reason)
