"""training.dispatch sends tasks by name: each name is a registered task, lands on its queue with its
arguments, and under task_always_eager runs in place (as `task.apply_async` did)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish, task_prerun

from stack.celery import app as celery_app
from training import dispatch

pytestmark = pytest.mark.django_db

GONE = 987654  # no such job, run or learner: every task is a no-op for it

NAMES = {
    dispatch.PROBE_JOB_RUN,
    dispatch.RUN_PLACE,
    dispatch.LEARNER_CHUNK,
    dispatch.SYNCER_TICK,
    dispatch.VERSIONS_EVALUATE,
    dispatch.RUNS_SUPERVISE,
}


def _drain(queue_name: str, *, delete: bool) -> list[Any]:
    """Take every message off a broker queue, as a worker of that queue would."""
    taken = []
    with celery_app.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name)
        try:
            message = queue.get(block=True, timeout=10)
            while True:
                message.ack()
                taken.append(message)
                message = queue.get_nowait()
        except queue.Empty:
            pass
        finally:
            if delete:
                queue.queue.delete()
            queue.close()
    return taken


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def on_publish(sender: str, headers: dict[str, Any], routing_key: str, **_: Any) -> None:
        seen.append(
            {
                "task": sender,
                "routing_key": routing_key,
                "argsrepr": headers["argsrepr"],
                "eta": headers["eta"],
            }
        )

    after_task_publish.connect(on_publish, weak=False)
    try:
        yield seen
    finally:
        after_task_publish.disconnect(on_publish)


@pytest.fixture
def eager() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    ran: list[tuple[str, tuple[Any, ...]]] = []

    def on_prerun(sender: Any, args: tuple[Any, ...], **_: Any) -> None:
        ran.append((sender.name, tuple(args)))

    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    task_prerun.connect(on_prerun, weak=False)
    try:
        yield ran
    finally:
        task_prerun.disconnect(on_prerun)
        celery_app.conf.task_always_eager = before


def test_every_name_dispatch_sends_is_a_registered_training_task() -> None:
    registered = {name for name in celery_app.tasks if name.startswith("training.")}
    assert registered == NAMES


def test_a_learner_chunk_goes_to_its_clusters_queue_with_learner_generation_and_seq(
    published: list[dict[str, Any]],
) -> None:
    slug = f"dispatch-{secrets.token_hex(4)}"

    dispatch.learner_chunk_enqueue(learner_id=GONE, generation=2, seq=5, cluster_slug=slug)

    assert published == [
        {
            "task": "training.learner_chunk",
            "routing_key": f"cluster.{slug}",
            "argsrepr": f"({GONE}, 2, 5)",
            "eta": None,
        }
    ]
    messages = _drain(f"cluster.{slug}", delete=True)
    assert [(m.headers["task"], m.payload[0]) for m in messages] == [("training.learner_chunk", [GONE, 2, 5])]


def test_a_runs_evaluator_goes_to_the_queue_it_is_given(published: list[dict[str, Any]]) -> None:
    slug = f"dispatch-{secrets.token_hex(4)}"

    dispatch.versions_evaluate_enqueue(run_id=GONE, token="t-1", queue=f"cluster.{slug}")

    assert [(p["task"], p["routing_key"], p["argsrepr"]) for p in published] == [
        ("training.versions_evaluate", f"cluster.{slug}", f"({GONE}, 't-1')")
    ]
    messages = _drain(f"cluster.{slug}", delete=True)
    assert [(m.headers["task"], m.payload[0]) for m in messages] == [
        ("training.versions_evaluate", [GONE, "t-1"])
    ]


def test_placement_and_syncer_ticks_go_to_the_control_queue_a_continued_tick_later(
    published: list[dict[str, Any]],
) -> None:
    dispatch.training_run_place_enqueue(run_id=GONE)
    dispatch.syncer_tick_enqueue(run_id=GONE, token="chain-a")
    dispatch.syncer_tick_enqueue(run_id=GONE, token="chain-a", countdown=0.5)

    assert [(p["task"], p["routing_key"], p["argsrepr"]) for p in published] == [
        ("training.run_place", "control", f"({GONE},)"),
        ("training.syncer_tick", "control", f"({GONE}, 'chain-a')"),
        ("training.syncer_tick", "control", f"({GONE}, 'chain-a')"),
    ]
    assert published[1]["eta"] is None and published[2]["eta"] is not None
    ours = [m for m in _drain("control", delete=False) if m.payload[0] and m.payload[0][0] == GONE]
    assert [m.headers["task"] for m in ours] == [
        "training.run_place",
        "training.syncer_tick",
        "training.syncer_tick",
    ]


def test_with_task_always_eager_each_send_runs_the_task_in_place(
    eager: list[tuple[str, tuple[Any, ...]]], published: list[dict[str, Any]]
) -> None:
    dispatch.probe_job_run_enqueue(job_id=GONE, cluster_slug="nowhere")
    dispatch.training_run_place_enqueue(run_id=GONE)
    dispatch.learner_chunk_enqueue(learner_id=GONE, generation=0, seq=0, cluster_slug="nowhere")
    dispatch.syncer_tick_enqueue(run_id=GONE, token="t", countdown=0.5)

    assert eager == [
        ("training.probe_job_run", (GONE,)),
        ("training.run_place", (GONE,)),
        ("training.learner_chunk", (GONE, 0, 0)),
        ("training.syncer_tick", (GONE, "t")),
    ]
    assert published == []  # nothing went to the broker
