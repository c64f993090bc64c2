"""Celery tasks for training: probe jobs and training-run learner chunks (cluster queues),
placement, the syncer and the supervisor (control queue). Thin: they call services and the
orchestrator's loops. Their names are training.dispatch's, which is how services send them."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_init, worker_ready

from training import dispatch, services
from training.orchestrator import learner_chunk_execute, syncer_tick_execute
from training.run_engines import warm_up


@worker_ready.connect
@worker_process_init.connect
def _warm_engine(**_: Any) -> None:
    """Import torch and the engine when a worker starts, not inside a run's first chunk.

    Only workers run this (the web process imports this module without importing torch): a
    learner's first chunk then pays for its run's corpus and model, not for a 2-second import.
    """
    warm_up()


@shared_task(bind=True, name=dispatch.PROBE_JOB_RUN, ignore_result=True)
def probe_job_run(self: Any, job_id: int) -> None:
    services.probe_job_execute(job_id=job_id, worker_hostname=self.request.hostname)


@shared_task(name=dispatch.RUN_PLACE, ignore_result=True)
def training_run_place_task(run_id: int) -> None:
    services.training_run_place(run_id=run_id)


@shared_task(bind=True, name=dispatch.LEARNER_CHUNK, ignore_result=True)
def learner_chunk_task(self: Any, learner_id: int, generation: int, seq: int) -> None:
    learner_chunk_execute(
        learner_id=learner_id, generation=generation, seq=seq, worker_hostname=self.request.hostname
    )


@shared_task(name=dispatch.SYNCER_TICK, ignore_result=True)
def syncer_tick_task(run_id: int, token: str) -> None:
    syncer_tick_execute(run_id=run_id, token=token)


@shared_task(name=dispatch.RUNS_SUPERVISE, ignore_result=True)
def training_runs_supervise_task() -> None:
    services.training_runs_supervise()
