"""The run's state graph, creating a run (validation before dispatch) and cancelling it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from training.models import InvalidTransition, TrainingRun, TrainingRunTransition
from training.run_config import RunConfigError
from training.services import RunStateError, training_run_cancel, training_run_create

S = TrainingRun.State


def test_the_graph_allows_running_and_recovering_back_and_forth_and_ends_in_final_states() -> None:
    assert TrainingRun.allowed(S.PENDING, S.PLACING)
    assert TrainingRun.allowed(S.RUNNING, S.RECOVERING)
    assert TrainingRun.allowed(S.RECOVERING, S.RUNNING)
    assert not TrainingRun.allowed(S.PENDING, S.RUNNING)
    assert not TrainingRun.allowed(S.PLACING, S.RECOVERING)
    for final in TrainingRun.FINAL_STATES:
        assert TrainingRun.TRANSITIONS[final] == frozenset()
    # Every state is in the graph and every target is a state.
    assert set(TrainingRun.TRANSITIONS) == set(S.values)
    assert set().union(*TrainingRun.TRANSITIONS.values()) <= set(S.values)


@pytest.mark.django_db
def test_each_transition_writes_a_row_and_a_forbidden_one_writes_nothing() -> None:
    run = TrainingRun.objects.create(name="r", config={})
    run.transition(S.PLACING, reason="choosing")
    run.transition(S.RUNNING, reason="placed")
    run.transition(S.RECOVERING, reason="lost one")
    run.transition(S.RUNNING, reason="back")
    run.transition(S.SUCCEEDED, reason="done")
    rows = list(TrainingRunTransition.objects.filter(run=run).values_list("from_state", "to_state", "reason"))
    assert rows == [
        ("pending", "placing", "choosing"),
        ("placing", "running", "placed"),
        ("running", "recovering", "lost one"),
        ("recovering", "running", "back"),
        ("running", "succeeded", "done"),
    ]
    run.refresh_from_db()
    assert run.started_at is not None and run.finished_at is not None
    with pytest.raises(InvalidTransition):
        run.transition(S.RUNNING, reason="again")
    assert TrainingRunTransition.objects.filter(run=run).count() == 5


@pytest.mark.django_db
def test_a_stale_in_memory_state_cannot_skip_the_graph() -> None:
    run = TrainingRun.objects.create(name="r", config={})
    other = TrainingRun.objects.get(pk=run.pk)
    run.transition(S.CANCELLED, reason="stop")
    with pytest.raises(InvalidTransition):
        other.transition(S.PLACING)  # it still believes the run is pending
    assert other.state == S.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_an_invalid_config_creates_and_dispatches_nothing(operator: User, settings: Any) -> None:
    with pytest.raises(RunConfigError) as info:
        training_run_create(config={"learners": {"count": 2, "quorum": 0}}, created_by=operator, name=" ")
    assert info.value.errors["learners.quorum"] == ["must be between 1 and learners.count (2)"]
    assert info.value.errors["name"] == ["a run needs a name"]
    assert "stop" in info.value.errors
    assert not TrainingRun.objects.exists()


@pytest.mark.django_db
def test_a_created_run_is_pending_and_can_be_cancelled_once(operator: User) -> None:
    run = training_run_create(config={"stop": {"outer_steps": 3}}, created_by=operator, name="first")
    assert run.state == S.PENDING
    assert run.config["learners"]["quorum"] == 2
    training_run_cancel(run=run, reason="changed my mind", by=operator)
    run.refresh_from_db()
    assert run.state == S.CANCELLED
    assert run.reason == f"changed my mind by {operator.username}"
    with pytest.raises(RunStateError):
        training_run_cancel(run=run, reason="again", by=operator)
