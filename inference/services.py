"""Writes of the inference app besides request recording (inference.recording, the one writer of
InferenceRequest and InferenceAttempt rows): quality records, chaos settings."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal

from django.contrib.auth.models import User
from django.utils import timezone

from inference.models import ChaosConfig, EvalCase, EvalRun, InferenceRequest, QualityRecord
from inference.selectors import rolling_caches_clear
from registry.models import Deployment, Workflow
from registry.services import RegistryError

# --- Quality -----------------------------------------------------------------------------------


def quality_record_create(
    *,
    deployment: Deployment,
    score: Decimal | float,
    source: str,
    workflow: Workflow | None = None,
    eval_run: EvalRun | None = None,
    eval_case: EvalCase | None = None,
    inference_request: InferenceRequest | None = None,
    comment: str = "",
) -> QualityRecord:
    """The only writer of QualityRecord rows. Score in [0, 1]; the router sees it within seconds."""
    try:
        value = Decimal(str(score)).quantize(Decimal("0.0001"), rounding=ROUND_HALF_EVEN)
    except ArithmeticError:
        raise RegistryError("score must be a number between 0 and 1", field="score") from None
    if not Decimal(0) <= value <= Decimal(1):
        raise RegistryError("score must be between 0 and 1", field="score")
    if source not in QualityRecord.Source.values:
        raise RegistryError(f"source must be one of {', '.join(QualityRecord.Source.values)}", field="source")
    record = QualityRecord.objects.create(
        deployment=deployment,
        workflow=workflow,
        source=source,
        score=value,
        eval_run=eval_run,
        eval_case=eval_case,
        inference_request=inference_request,
        comment=comment[:500],
    )
    rolling_caches_clear()
    return record


# --- Chaos drills ----------------------------------------------------------------------------------


def chaos_config_set(
    *,
    deployment: Deployment,
    enabled: bool,
    user: User | None,
    error_rate: float = 0.0,
    status_codes: Sequence[int] = (),
    latency_ms: int = 0,
    malformed_rate: float = 0.0,
) -> ChaosConfig:
    """Switch fault injection for a deployment on or off; the next routed request sees it."""
    for name, rate in (("error_rate", error_rate), ("malformed_rate", malformed_rate)):
        if not 0.0 <= float(rate) <= 1.0:
            raise RegistryError("a rate is between 0 and 1", field=name)
    codes = [int(c) for c in status_codes]
    if any(not 100 <= c <= 599 for c in codes):
        raise RegistryError("status codes are HTTP codes (100-599)", field="status_codes")
    if latency_ms < 0:
        raise RegistryError("latency cannot be negative", field="latency_ms")
    config, _ = ChaosConfig.objects.update_or_create(
        deployment=deployment,
        defaults={
            "enabled": enabled,
            "error_rate": float(error_rate),
            "status_codes": codes,
            "latency_ms": int(latency_ms),
            "malformed_rate": float(malformed_rate),
            "updated_at": timezone.now(),
            "updated_by": user,
        },
    )
    return config
