"""Celery tasks for training: probe jobs and training-run learner chunks (cluster queues),
placement, the syncer and the supervisor (control queue). Thin: they call services."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_init, worker_ready

from training import services


@worker_ready.connect
@worker_process_init.connect
def _warm_engine(**_: Any) -> None:
    """Import torch and the engine when a worker starts, not inside a run's first chunk.

    Only workers run this (the web process imports this module without importing torch): a
    learner's first chunk then pays for its run's corpus and model, not for a 2-second import.
    """
    from training.orchestrator import warm_up

    warm_up()


@shared_task(bind=True, name="training.probe_job_run", ignore_result=True)
def probe_job_run(self: Any, job_id: int) -> None:
    services.probe_job_execute(job_id=job_id, worker_hostname=self.request.hostname)


@shared_task(name="training.run_place", ignore_result=True)
def training_run_place_task(run_id: int) -> None:
    services.training_run_place(run_id=run_id)


@shared_task(bind=True, name="training.learner_chunk", ignore_result=True)
def learner_chunk_task(self: Any, learner_id: int, generation: int, seq: int) -> None:
    from training.orchestrator import learner_chunk_execute

    learner_chunk_execute(
        learner_id=learner_id, generation=generation, seq=seq, worker_hostname=self.request.hostname
    )


@shared_task(name="training.syncer_tick", ignore_result=True)
def syncer_tick_task(run_id: int, token: str) -> None:
    from training.orchestrator import syncer_tick_execute

    syncer_tick_execute(run_id=run_id, token=token)


@shared_task(name="training.runs_supervise", ignore_result=True)
def training_runs_supervise_task() -> None:
    services.training_runs_supervise()
