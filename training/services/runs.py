"""A training run's life: creating, cancelling, failing, finishing and stopping it at its budget.

training_run_create (pending) → training_run_place on the control queue (placing → running;
learners placed, version 0 published) → learner chunks on each cluster's queue and syncer ticks on
the control queue (training.orchestrator) → succeeded | failed | cancelled | budget_exhausted.
training_runs_supervise (beat) restarts a silent syncer and fails lost learners over.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max

from registry.errors import DomainError
from registry.models import Team
from registry.store.keys import ObjectReach
from training import dispatch, selectors
from training.models import (
    GlobalVersionRecord,
    InvalidTransition,
    TrainingLearner,
    TrainingRun,
    TrainingRunTransition,
)
from training.run_config import RunConfig, RunConfigError, run_config_validate
from training.run_engines import run_engine, run_transport, write_artifact
from training.services.lineage import model_version_register_final

logger = logging.getLogger(__name__)


class RunStateError(DomainError, ValueError):
    """An action that the run's current state does not allow; the message is shown as is."""

    status_code = 400


def transition_quietly(run: TrainingRun, new: str, *, reason: str) -> bool:
    """Transition, or return False when another process already moved the run on."""
    try:
        run.transition(new, reason=reason)
    except InvalidTransition:
        return False
    return True


def training_run_create(
    *, config: dict[str, Any], created_by: User | None, name: str, teams: frozenset[int] | None = None
) -> TrainingRun:
    """Validate `config`, create the run in `pending` and dispatch placement after commit.

    `teams`: the teams the caller may launch runs in (None: any, or none). A caller limited to
    teams names one of them as the config's `team`, starts from model versions of that team's
    runs only, and names only that team's keys of the object store (model_uri, tokenizer_uri,
    dataset: registry.store.keys); another team's reads as one that does not exist.

    Raises RunConfigError (field → messages) before anything is written or dispatched.
    """
    name = (name or "").strip()
    team_id = _config_team_id(config) if teams is not None else None
    if teams is not None:
        _start_from_check(config, team_id if team_id in teams else None)
    errors: dict[str, list[str]] = {}
    try:
        cfg = run_config_validate(config, reach=ObjectReach(teams=teams, team_id=team_id))
    except RunConfigError as exc:
        errors.update(exc.errors)
        cfg = {}
    team = None
    if cfg.get("team"):
        candidates = Team.objects.all() if teams is None else Team.objects.filter(pk__in=teams)
        team = candidates.filter(slug=cfg["team"]).first()
        if team is None:
            errors.setdefault("team", []).append(f"no team {cfg['team']!r}")
    elif teams is not None and cfg:
        errors.setdefault("team", []).append("Name one of your teams")
    if not name:
        errors.setdefault("name", []).append("a run needs a name")
    elif len(name) > 128:
        errors.setdefault("name", []).append("at most 128 characters")
    if errors:
        raise RunConfigError(errors)
    budget = RunConfig(cfg).money_budget
    with transaction.atomic():
        run = TrainingRun.objects.create(
            name=name,
            config=cfg,
            created_by=created_by,
            money_budget=budget,
            currency=cfg["currency"],
            team=team,
            reason="created",
            # The lineage: start_from was resolved to a model version's id by validation.
            started_from_id=(cfg.get("start_from") or {}).get("model_version"),
        )
        TrainingRunTransition.objects.create(
            run=run, from_state="", to_state=run.state, at=run.created_at, reason="created"
        )
        run_id = run.pk
        transaction.on_commit(lambda: dispatch.training_run_place_enqueue(run_id=run_id))
    return run


def _config_team_id(config: Any) -> int | None:
    """The id of the team a raw config names (None: none, or no such team)."""
    slug = config.get("team") if isinstance(config, dict) else None
    if not isinstance(slug, str) or not slug.strip():
        return None
    return Team.objects.filter(slug=slug.strip()).values_list("pk", flat=True).first()


def _start_from_check(config: Any, team_id: int | None) -> None:
    """A team-scoped caller starts a run of team `team_id` (None: none it may launch in) from
    that team's model versions only: another team's, even one the caller also belongs to, reads
    as one that does not exist, before validation reads the version's config (its architecture
    would show in the messages)."""
    start = config.get("start_from") if isinstance(config, dict) else None
    if not isinstance(start, dict):
        return
    ref = start.get("model_version")
    version = selectors.model_version_lookup(ref)
    if version is not None and (team_id is None or version.run.team_id != team_id):
        raise RunConfigError(
            {
                "start_from.model_version": [
                    f"no model version {ref!r}: give <model slug>@<number> or a model version id"
                ]
            }
        )


def training_run_cancel(*, run: TrainingRun, reason: str, by: User | None) -> TrainingRun:
    """Stop a run: in-flight chunks notice within a couple of seconds and bill nothing after."""
    who = f" by {by.get_username()}" if by is not None else ""
    why = (reason or "").strip() or "cancelled"
    try:
        run.transition(TrainingRun.State.CANCELLED, reason=f"{why}{who}")
    except InvalidTransition as exc:
        raise RunStateError(
            f"run #{run.pk} is {run.state}; only a pending or live run can be cancelled"
        ) from exc
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    return run


def training_run_fail(*, run_id: int, reason: str) -> TrainingRun | None:
    """Move a live run to `failed` (no-op when it already ended)."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or not transition_quietly(run, TrainingRun.State.FAILED, reason=reason[:1000]):
        return run
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    return run


def training_run_check_stop(*, run: TrainingRun) -> TrainingRun:
    """Finish the run when its stop condition holds, or stop it when its money budget (or a hard
    budget of its team or of the run) is spent."""
    run.refresh_from_db()
    if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return run
    rc = RunConfig(run.config)
    if run.money_budget is not None and selectors.run_spend(run_id=run.pk) >= run.money_budget:
        return training_run_budget_exhaust(run=run)
    refusal = selectors.run_budget_refusal(run=run)
    if refusal:
        return training_run_budget_exhaust(run=run, why=refusal)
    records = GlobalVersionRecord.objects.filter(run=run)
    done = False
    if rc.outer_steps is not None:
        newest = dict(records.values_list("fragment").annotate(v=Max("version")).values_list("fragment", "v"))
        done = len(newest) == rc.fragment_count and all(v >= rc.outer_steps for v in newest.values())
        why = f"{rc.outer_steps} outer steps on every fragment"
    else:
        total = records.aggregate(t=Max("tokens_total"))["t"] or 0
        done = rc.token_budget is not None and total >= rc.token_budget
        why = f"token budget {rc.token_budget} merged"
    if done:
        return training_run_succeed(run=run, why=why)
    return run


def training_run_succeed(*, run: TrainingRun, why: str) -> TrainingRun:
    """Register the final parameters as the run's final model version (exported in the
    open-weights layout for a brought Llama or GPT-2) and move the run to `succeeded`."""
    final = model_version_register_final(run=run, engine=run_engine(run), transport=run_transport(run))
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if locked.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
            return locked
        model = final.registered_model
        uri, loss = final.artifact_uri, final.eval_loss
        TrainingRun.objects.filter(pk=run.pk).update(
            registered_model=model, final_eval_loss=loss, artifact_uri=uri
        )
        run.registered_model, run.final_eval_loss, run.artifact_uri = model, loss, uri
        run.transition(
            TrainingRun.State.SUCCEEDED,
            reason=f"{why}; versions {final.fragment_versions}; model {final}",
        )
        TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.LOST).update(
            state=TrainingLearner.State.DONE, state_changed_at=run.state_changed_at
        )
        TrainingLearner.objects.filter(run=run, state=TrainingLearner.State.LOST).update(
            state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
        )
    return run


def training_run_stop_by_rule(*, run_id: int, reason: str) -> TrainingRun | None:
    """End a live run early because a rule of its own config says training is done (the
    build-or-buy target reached, or buying cheaper at the forecast volume): it succeeds with its
    final version registered, and its reason names the rule and the figures. No-op (the run as
    it is) when it already ended; None when it is gone."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return run
    return training_run_succeed(run=run, why=f"stopped by rule: {reason}"[:900])


def training_run_budget_exhaust(*, run: TrainingRun, why: str = "") -> TrainingRun:
    """A budget is spent: stop cleanly, keeping the last published version as a checkpoint.

    `why` names the budget (a hard budget of the run's team, of the run, or of every cluster it
    could use); without it, the run's own money budget is the one spent."""
    if not why:
        spent = selectors.run_spend(run_id=run.pk)
        why = f"money budget {run.money_budget} {run.currency} spent ({spent})"
    if not transition_quietly(run, TrainingRun.State.BUDGET_EXHAUSTED, reason=why):
        return run
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    try:
        uri, loss, _, _ = write_artifact(run, kind="checkpoint")
    except Exception:
        logger.exception("run %s: checkpoint artifact not written", run.pk)
        return run
    TrainingRun.objects.filter(pk=run.pk).update(artifact_uri=uri, final_eval_loss=loss)
    run.artifact_uri, run.final_eval_loss = uri, loss
    return run
