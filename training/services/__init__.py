"""Writes for training: probe jobs and DiLoCo training runs; callers import from here.

One module per concern: probes (probe jobs), runs (a run's life and state), placing (the first
placement and version 0), chunks (learner chunks and their bill), syncer (the syncer chain and the
version records), evaluation (each version's eval loss, on a cluster's queue), lineage (model versions: every k-th global version and the final export),
retention (what the run keeps in the store: the sweep after each publish), transfers (checkpoints and deltas crossing between cluster stores, billed as egress), supervision (beat's checks and learner failover). Tasks are sent through
training.dispatch, never by importing training.tasks.
"""

from __future__ import annotations

from training.services.chunks import (
    BUDGET_REACHED,
    INTERRUPTED,
    MAX_CHUNK_FAILURES,
    ChunkClaim,
    ChunkOutcome,
    DevicesBusy,
    learner_chunk_budget_deadline,
    learner_chunk_claim,
    learner_chunk_finish,
    learner_chunk_progress,
    learner_chunk_should_stop,
    training_run_budget_reached,
)
from training.services.evaluation import (
    EVAL_TASK_SECONDS,
    evaluator_queue,
    pending_evaluation,
    versions_evaluate,
    versions_evaluate_send,
)
from training.services.lineage import model_version_register_final, model_versions_register_due
from training.services.placing import training_run_place
from training.services.probes import (
    DispatchError,
    probe_job_claim,
    probe_job_create,
    probe_job_execute,
    probe_job_finish,
    probe_job_progress,
)
from training.services.retention import run_store_sweep
from training.services.runs import (
    RunStateError,
    training_run_budget_exhaust,
    training_run_cancel,
    training_run_check_stop,
    training_run_create,
    training_run_fail,
    training_run_stop_by_rule,
    training_run_succeed,
)
from training.services.supervision import (
    INTERRUPTION_STOP_SECONDS,
    PLACEMENT_RETRY_SECONDS,
    learner_failover,
    training_runs_supervise,
)
from training.services.syncer import (
    SYNCER_STALE_SECONDS,
    SYNCER_TICK_SECONDS,
    global_versions_record_missing,
    syncer_restart,
    syncer_tick_claim,
    syncer_tick_continue,
)
from training.services.transfers import CheckpointMove, chunk_egress_bill, learner_checkpoint_bring

__all__ = [
    "CheckpointMove",
    "chunk_egress_bill",
    "learner_checkpoint_bring",
    "BUDGET_REACHED",
    "INTERRUPTED",
    "DevicesBusy",
    "INTERRUPTION_STOP_SECONDS",
    "MAX_CHUNK_FAILURES",
    "PLACEMENT_RETRY_SECONDS",
    "SYNCER_STALE_SECONDS",
    "SYNCER_TICK_SECONDS",
    "ChunkClaim",
    "ChunkOutcome",
    "DispatchError",
    "RunStateError",
    "global_versions_record_missing",
    "EVAL_TASK_SECONDS",
    "evaluator_queue",
    "pending_evaluation",
    "versions_evaluate",
    "versions_evaluate_send",
    "learner_chunk_claim",
    "learner_chunk_finish",
    "learner_chunk_progress",
    "learner_chunk_budget_deadline",
    "learner_chunk_should_stop",
    "learner_failover",
    "model_version_register_final",
    "model_versions_register_due",
    "probe_job_claim",
    "probe_job_create",
    "probe_job_execute",
    "probe_job_finish",
    "probe_job_progress",
    "run_store_sweep",
    "syncer_restart",
    "syncer_tick_claim",
    "syncer_tick_continue",
    "training_run_budget_exhaust",
    "training_run_budget_reached",
    "training_run_cancel",
    "training_run_check_stop",
    "training_run_create",
    "training_run_fail",
    "training_run_place",
    "training_run_stop_by_rule",
    "training_run_succeed",
    "training_runs_supervise",
]
