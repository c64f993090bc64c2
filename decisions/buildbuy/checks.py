"""The part of the `build_or_buy` run option only the composition app can check: every workflow
has an eval set with cases (training knows workflows, not eval sets)."""

from __future__ import annotations

from typing import Any

from inference.models import EvalCase
from training.run_config.schema import Errors

FIELD = "build_or_buy.workflows"


def build_or_buy_eval_sets_check(option: dict[str, Any], errors: Errors) -> None:
    slugs = option.get("workflows") or []
    scored = set(
        EvalCase.objects.filter(eval_set__workflow__slug__in=slugs).values_list(
            "eval_set__workflow__slug", flat=True
        )
    )
    for slug in slugs:
        if slug not in scored:
            errors.add(FIELD, f"workflow {slug!r} has no eval set with cases to score versions on")
