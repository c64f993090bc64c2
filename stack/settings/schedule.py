"""Periodic work, declared in one place. django-celery-beat copies these into its tables when
beat starts; operators can tune them in the admin afterwards. Each period is read from the
environment here (docs/configuration.md lists every variable)."""

from __future__ import annotations

from typing import Any

from celery.schedules import crontab

from stack.env import env_float, env_int


def beat_schedule(*, health_check_seconds: float) -> dict[str, Any]:
    return {
        "cluster-health-check": {
            "task": "stack.cluster_health_check",
            "schedule": health_check_seconds,
            "options": {"queue": "control", "expires": health_check_seconds * 2},
        },
        "training-runs-supervise": {
            "task": "training.runs_supervise",
            "schedule": env_float("SWITCHYARD_TRAINING_SUPERVISE_SECONDS", 3.0, minimum=0.5),
            "options": {"queue": "control", "expires": 30},
        },
        "billing-rollups": {
            "task": "billing.rollups_update",
            "schedule": env_float("SWITCHYARD_ROLLUP_SECONDS", 60.0, minimum=1.0),
            "options": {"queue": "control", "expires": 120},
        },
        # Scheduled eval sets on every deployment of their routes (inference quality records).
        "inference-eval-sets": {
            "task": "inference.eval_sets_scheduled",
            "schedule": env_float("SWITCHYARD_EVAL_SCHEDULE_SECONDS", 3600.0, minimum=10.0),
            "options": {"queue": "control", "expires": 600},
        },
        # Journaled requests that no web process folded (every web process gone): into the ledger.
        "inference-journal-fold": {
            "task": "inference.journal_fold",
            "schedule": env_float("SWITCHYARD_JOURNAL_FOLD_SECONDS", 10.0, minimum=0.5),
            "options": {"queue": "control", "expires": 30},
        },
        # Spend anomalies per provider, workflow and cluster, from the rollups (billing.alerts).
        "billing-spend-anomalies": {
            "task": "billing.spend_anomalies_detect",
            "schedule": env_float("SWITCHYARD_ANOMALY_SECONDS", 900.0, minimum=10.0),
            "options": {"queue": "control", "expires": 600},
        },
        # Yesterday's spend digest per team, shortly after the UTC day closed and the rollups caught up.
        "billing-spend-digest": {
            "task": "billing.spend_digest_send",
            "schedule": crontab(minute=15, hour=env_int("SWITCHYARD_DIGEST_HOUR_UTC", 0, minimum=0)),
            "options": {"queue": "control", "expires": 3600},
        },
        # Build or buy: model versions whose scoring a lost signal or a killed worker left behind.
        "decisions-version-evaluations-sweep": {
            "task": "decisions.version_evaluations_sweep",
            "schedule": env_float("SWITCHYARD_BUILD_OR_BUY_SWEEP_SECONDS", 60.0, minimum=1.0),
            "options": {"queue": "control", "expires": 120},
        },
        # Batch inference jobs whose worker died (stale lease) are re-queued and resume.
        "inference-batch-jobs-resume": {
            "task": "inference.batch_jobs_resume",
            "schedule": env_float("SWITCHYARD_BATCH_RESUME_SECONDS", 30.0, minimum=0.5),
            "options": {"queue": "control", "expires": 60},
        },
        # Replay studies whose worker died (stale heartbeat and batch leases) are resumed.
        "decisions-replay-studies-resume": {
            "task": "decisions.replay_studies_resume",
            "schedule": env_float("SWITCHYARD_REPLAY_RESUME_SECONDS", 60.0, minimum=0.5),
            "options": {"queue": "control", "expires": 60},
        },
        # Kept prompts (opt-in, per workflow) past their retention, and replay objects holding them.
        "inference-retained-prompts-purge": {
            "task": "inference.retained_prompts_purge",
            "schedule": env_float("SWITCHYARD_RETENTION_PURGE_SECONDS", 3600.0, minimum=10.0),
            "options": {"queue": "control", "expires": 3600},
        },
        # Answers kept for an Idempotency-Key replay (opted-in workflows only) past their window.
        "inference-idempotent-answers-purge": {
            "task": "inference.idempotent_answers_purge",
            "schedule": env_float("SWITCHYARD_IDEMPOTENCY_PURGE_SECONDS", 60.0, minimum=1.0),
            "options": {"queue": "control", "expires": 60},
        },
    }
