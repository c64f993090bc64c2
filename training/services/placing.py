"""Placing a run's learners on clusters: the first placement, version 0 and the decision rows."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from training import dispatch, selectors
from training.models import InvalidTransition, PlacementDecision, TrainingLearner, TrainingRun
from training.placement import Assignment, Constraints, PlacementResult, place
from training.run_config import RunConfig
from training.run_engines import run_initialise
from training.services.runs import transition_quietly

logger = logging.getLogger(__name__)


def _constraints(rc: RunConfig) -> Constraints:
    place_cfg = rc.raw["placement"]
    return Constraints(
        accelerator_type=place_cfg["accelerator_type"],
        regions=tuple(place_cfg["regions"]),
        pins={int(k): v for k, v in place_cfg["pins"].items()},
        ranks=rc.ranks,
    )


def placement_decision_record(
    *,
    run: TrainingRun,
    index: int,
    generation: int,
    assignment: Assignment,
    result: PlacementResult,
    reason: str,
    now: datetime,
) -> PlacementDecision:
    """Why learner `index` of `generation` went where it did; written once per generation."""
    option = assignment.option
    decision, _ = PlacementDecision.objects.get_or_create(
        run=run,
        learner_index=index,
        generation=generation,
        defaults={
            "cluster_id": option.cluster_id,
            "reason": reason,
            "unit_price": option.price,
            "currency": option.currency,
            "price_book_id": option.price_book_id,
            "candidates": result.candidates,
            "decided_at": now,
        },
    )
    return decision


def training_run_place(*, run_id: int) -> TrainingRun | None:
    """Place a pending run's learners, publish version 0 and start it (the control task).

    Idempotent: a run already past `placing` is left alone; a run stuck in `placing` (its
    worker died) is placed again by the supervisor, and version 0 is write-once.
    """
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None:
        return None
    if run.state == TrainingRun.State.PENDING:
        try:
            run.transition(TrainingRun.State.PLACING, reason="choosing clusters")
        except InvalidTransition:
            return run
    elif run.state != TrainingRun.State.PLACING:
        return run
    now = timezone.now()
    rc = RunConfig(run.config)
    result = place(
        learners=list(range(rc.learners)),
        options=selectors.cluster_options(
            at=now, exclude_run_id=run.pk, team=run.team_slug, training_run_id=str(run.pk)
        ),
        constraints=_constraints(rc),
    )
    if len(result.assignments) < rc.quorum:
        reason = (
            f"placement: {len(result.assignments)} of {rc.learners} learners placed, quorum is {rc.quorum}; "
            + "; ".join(result.problems)
        )
        transition_quietly(run, TrainingRun.State.FAILED, reason=reason)
        return run
    try:
        initial_loss = run_initialise(run)
    except Exception as exc:  # a bad dataset or store URL: the run fails, saying why
        logger.exception("run %s could not be initialised", run.pk)
        transition_quietly(
            run, TrainingRun.State.FAILED, reason=f"initialisation failed: {type(exc).__name__}: {exc}"
        )
        return run
    placed = {a.learner_index: a for a in result.assignments}
    token = uuid.uuid4().hex
    # Started now, after version 0 is published: the run's and the learners' clocks start when
    # the learners can train (initialising loads the corpus and evaluates version 0).
    now = timezone.now()
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if locked.state != TrainingRun.State.PLACING:
            return locked
        learners = []
        for index in range(rc.learners):
            a = placed.get(index)
            learner, _ = TrainingLearner.objects.get_or_create(
                run=run,
                index=index,
                defaults={
                    "cluster_id": a.option.cluster_id if a else None,
                    "state": TrainingLearner.State.PLACED if a else TrainingLearner.State.LOST,
                    "state_changed_at": now,
                    "last_error": "" if a else "not placed: " + "; ".join(result.problems),
                },
            )
            learners.append(learner)
            if a is not None:
                reason = PlacementDecision.Reason.PINNED if a.pinned else PlacementDecision.Reason.INITIAL
                placement_decision_record(
                    run=run, index=index, generation=0, assignment=a, result=result, reason=reason, now=now
                )
        TrainingRun.objects.filter(pk=run.pk).update(
            initial_eval_loss=initial_loss, syncer_token=token, syncer_seen_at=now
        )
        run.initial_eval_loss, run.syncer_token = initial_loss, token
        where = ", ".join(f"learner {i} → {placed[i].option.slug}" for i in sorted(placed))
        missing = f"; {rc.learners - len(placed)} unplaced, retrying" if len(placed) < rc.learners else ""
        run.transition(TrainingRun.State.RUNNING, reason=f"placed {where}{missing}", now=now)
        chunk_targets = [
            (ln.pk, ln.generation, placed[ln.index].option.slug) for ln in learners if ln.index in placed
        ]
        transaction.on_commit(lambda: _enqueue_start(run_id=run.pk, token=token, chunks=chunk_targets))
    return run


def _enqueue_start(*, run_id: int, token: str, chunks: list[tuple[int, int, str]]) -> None:
    """Every placed learner's first chunk on its cluster's queue, then the syncer's first tick."""
    for learner_id, generation, slug in chunks:
        dispatch.learner_chunk_enqueue(learner_id=learner_id, generation=generation, seq=0, cluster_slug=slug)
    dispatch.syncer_tick_enqueue(run_id=run_id, token=token)
