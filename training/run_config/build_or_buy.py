"""The `build_or_buy` run option: score each registered model version against the APIs a team
could buy the same work from, and optionally stop training when buying wins.

    build_or_buy: {
      workflows: [slug, ...],          # whose eval sets score each version (and whose route's
                                       # API deployments are the "buy" side)
      serve_cluster: slug | null,      # the cluster whose accelerator-hour price serving costs
      volume_tokens_per_month: int,    # the forecast volume the break-even is judged at
      horizon_months: int,             # training cost is amortised over this many months
      target_quality: number | "best_api" | "cheapest_api" | null,
      stop_when_buying_cheaper: bool,
    }

Training only checks what the registry can answer (workflows exist and the run's team may use
them, the cluster exists). Whether each workflow has an eval set is inference's knowledge;
the composition app registers that check (`run_config_check_register`), so training never
imports inference.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from training.run_config.schema import Errors

FIELD = "build_or_buy"
KEYS = (
    "workflows",
    "serve_cluster",
    "volume_tokens_per_month",
    "horizon_months",
    "target_quality",
    "stop_when_buying_cheaper",
)
TARGET_WORDS = ("best_api", "cheapest_api")
MAX_VOLUME = 10**15  # tokens a month: far beyond any fleet, and still a bigint
MAX_HORIZON = 120  # months

# Checks other apps add (a workflow without an eval set cannot score anything): each gets the
# normalised option and the Errors to add to, keyed by dotted path.
_CHECKS: list[Callable[[dict[str, Any], Errors], None]] = []


def run_config_check_register(check: Callable[[dict[str, Any], Errors], None]) -> None:
    """Add a check of the normalised `build_or_buy` option (once per callable)."""
    if check not in _CHECKS:
        _CHECKS.append(check)


def _int(value: Any, path: str, lo: int, hi: int, errors: Errors) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(path, "must be an integer")
        return None
    if not lo <= value <= hi:
        errors.add(path, f"must be between {lo} and {hi}")
        return None
    return value


def check_build_or_buy(cfg: dict[str, Any], errors: Errors) -> None:
    """Validate and normalise cfg["build_or_buy"] in place (None: the option is off)."""
    raw = cfg.get(FIELD)
    if raw is None:
        return
    if not isinstance(raw, dict):
        errors.add(FIELD, "must be an object: {workflows, volume_tokens_per_month, horizon_months, ...}")
        return
    for key in sorted(set(raw) - set(KEYS)):
        errors.add(f"{FIELD}.{key}", "unknown field")
    out: dict[str, Any] = {}
    # Imported here: RunConfig is also used where Django is not set up (bench processes).
    from registry.models import Cluster, Workflow

    slugs = raw.get("workflows")
    if not isinstance(slugs, list) or not slugs or not all(isinstance(s, str) and s for s in slugs):
        errors.add(f"{FIELD}.workflows", "must be a non-empty list of workflow slugs")
    else:
        slugs = list(dict.fromkeys(slugs))
        found = {w.slug: w for w in Workflow.objects.filter(slug__in=slugs).select_related("team")}
        team = cfg.get("team") or ""
        for slug in slugs:
            workflow = found.get(slug)
            if workflow is None:
                errors.add(f"{FIELD}.workflows", f"no workflow {slug!r}")
            elif team and (workflow.team is None or workflow.team.slug != team):
                # A team's run scores its own team's workflows only (their eval sets and
                # routes are that team's); a platform run may use any.
                errors.add(f"{FIELD}.workflows", f"workflow {slug!r} is not team {team}'s")
        out["workflows"] = slugs
    cluster = raw.get("serve_cluster")
    if cluster is not None and (
        not isinstance(cluster, str) or not Cluster.objects.filter(slug=cluster).exists()
    ):
        errors.add(f"{FIELD}.serve_cluster", f"no cluster {cluster!r}")
    out["serve_cluster"] = cluster
    if "volume_tokens_per_month" not in raw:
        errors.add(f"{FIELD}.volume_tokens_per_month", "required: the tokens a month to judge at")
    else:
        out["volume_tokens_per_month"] = _int(
            raw["volume_tokens_per_month"], f"{FIELD}.volume_tokens_per_month", 1, MAX_VOLUME, errors
        )
    out["horizon_months"] = _int(
        raw.get("horizon_months", 12), f"{FIELD}.horizon_months", 1, MAX_HORIZON, errors
    )
    target = raw.get("target_quality")
    if target is None or target in TARGET_WORDS:
        out["target_quality"] = target
    elif isinstance(target, bool) or not isinstance(target, int | float | str):
        errors.add(
            f"{FIELD}.target_quality", 'must be a number in [0, 1], "best_api", "cheapest_api" or null'
        )
    else:
        try:
            value = Decimal(str(target))
        except InvalidOperation:
            value = Decimal("NaN")
        if not value.is_finite() or not Decimal(0) <= value <= Decimal(1):
            errors.add(
                f"{FIELD}.target_quality", 'must be a number in [0, 1], "best_api", "cheapest_api" or null'
            )
        else:
            out["target_quality"] = str(value)
    stop = raw.get("stop_when_buying_cheaper", False)
    if not isinstance(stop, bool):
        errors.add(f"{FIELD}.stop_when_buying_cheaper", "must be true or false")
    out["stop_when_buying_cheaper"] = stop
    if any(k.startswith(FIELD) for k in errors.by_field):
        return
    cfg[FIELD] = out
    for check in _CHECKS:
        check(out, errors)
