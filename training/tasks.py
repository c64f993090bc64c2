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


# How long a chunk whose devices are owned by its worker's other chunks waits before it asks again.
DEVICES_BUSY_RETRY_SECONDS = 5


@shared_task(bind=True, name=dispatch.LEARNER_CHUNK, ignore_result=True)
def learner_chunk_task(self: Any, learner_id: int, generation: int, seq: int) -> None:
    try:
        learner_chunk_execute(
            learner_id=learner_id, generation=generation, seq=seq, worker_hostname=self.request.hostname
        )
    except services.DevicesBusy as busy:
        # Not a failure: another learner's chunk holds the GPUs; the supervisor moves this
        # learner if it waits past its learner_timeout.
        raise self.retry(countdown=DEVICES_BUSY_RETRY_SECONDS, max_retries=None, exc=busy) from None


@shared_task(name=dispatch.SYNCER_TICK, ignore_result=True)
def syncer_tick_task(run_id: int, token: str) -> None:
    syncer_tick_execute(run_id=run_id, token=token)


@shared_task(name=dispatch.VERSIONS_EVALUATE, ignore_result=True)
def versions_evaluate_task(run_id: int, token: str) -> None:
    services.versions_evaluate(run_id=run_id, token=token, seconds=services.EVAL_TASK_SECONDS)


@shared_task(name=dispatch.RUNS_SUPERVISE, ignore_result=True)
def training_runs_supervise_task() -> None:
    services.training_runs_supervise()
