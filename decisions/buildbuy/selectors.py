"""Build or buy, the reads: one report per run that the panel, the API and the stop rule share.

Every money figure comes from the ledger or the price book: the run's spend (UsageRecord rows
of subject training_run:<id>, evaluation included), each version's training cost (its spend
when it was published, ModelVersion.cost), the self-hosted $/1M from billing.selfhosted (the
serve cluster's accelerator time over the tokens served), each API's $/1M from its price-book
token prices blended by the token mix its eval answered, and its cost per request from the
eval run's billed cost. The arithmetic is decisions.buildbuy.maths.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Sum
from django.utils import timezone

from billing.amortisation import amortised_per_1m
from billing.models import Unit, UsageRecord
from billing.selectors import PriceResolver, spend_total
from billing.selfhosted import self_hosted_cost
from decisions.buildbuy import decide, maths
from decisions.buildbuy.services import RUN_SUBJECT, build_or_buy_option
from decisions.models import ApiScore, VersionEvaluation, VersionScore
from inference.models import QualityRecord
from registry.models import Deployment, Workflow
from training.models import ModelVersion, TrainingRun

QUALITY = Decimal("0.0001")
INTERVAL_NOTE = "80% percentile bootstrap over the scored versions (200 resamples, fixed seed)"
FIT_NOTE = "quality linear in ln(money spent): Kaplan et al. 2020, arXiv 2001.08361"


def _text(value: Decimal | None) -> str | None:
    return None if value is None else _fixed(value)


def _fixed(value: Decimal) -> str:
    """A Decimal as plain digits: str() writes 1.30E-7 for a ledger amount of 0.000000130."""
    return format(value, "f")


@dataclass
class _Api:
    deployment: Deployment
    quality: Decimal
    per_1m: Decimal | None
    cost_per_request: Decimal | None
    input_per_1m: Decimal | None
    output_per_1m: Decimal | None
    tokens_in: int
    tokens_out: int
    eval_runs: list[int]
    reused: bool

    def doc(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment.slug,
            "quality": _fixed(self.quality),
            "price_per_1m_tokens": _text(self.per_1m),
            "cost_per_request": _text(self.cost_per_request),
            "input_price_per_1m": _text(self.input_per_1m),
            "output_price_per_1m": _text(self.output_per_1m),
            "eval_tokens_in": self.tokens_in,
            "eval_tokens_out": self.tokens_out,
            "eval_runs": self.eval_runs,
            "reused_eval_run": self.reused,
        }


def _mean_score(eval_run_ids: list[int]) -> Decimal | None:
    mean = QualityRecord.objects.filter(eval_run_id__in=eval_run_ids).aggregate(m=Avg("score"))["m"]
    return None if mean is None else Decimal(mean).quantize(QUALITY)


def _apis(run: TrainingRun, workflow: Workflow, prices: PriceResolver) -> list[_Api]:
    by_deployment: dict[int, list[ApiScore]] = {}
    for score in ApiScore.objects.filter(run=run, workflow=workflow).select_related("deployment", "eval_run"):
        if score.eval_run.state == score.eval_run.State.SUCCEEDED:
            by_deployment.setdefault(score.deployment_id, []).append(score)
    now = timezone.now()
    out = []
    for scores in by_deployment.values():
        deployment = scores[0].deployment
        ids = [s.eval_run_id for s in scores]
        quality = _mean_score(ids)
        if quality is None:
            continue
        tokens = QualityRecord.objects.filter(eval_run_id__in=ids).aggregate(
            i=Sum("inference_request__tokens_in"), o=Sum("inference_request__tokens_out")
        )
        tin, tout = int(tokens["i"] or 0), int(tokens["o"] or 0)
        unit_prices = []
        for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
            found = prices.resolve(
                unit=unit, at=now, deployment_id=deployment.pk, provider_id=deployment.provider_id
            )
            unit_prices.append(found.unit_price if found is not None else None)
        pin, pout = unit_prices
        per_1m = (
            maths.blended_per_1m(input_per_1m=pin, output_per_1m=pout, tokens_in=tin, tokens_out=tout)
            if pin is not None and pout is not None
            else None
        )
        requests = sum(s.eval_run.cases_done for s in scores)
        cost = sum((s.eval_run.cost for s in scores), Decimal(0))
        out.append(
            _Api(
                deployment=deployment,
                quality=quality,
                per_1m=per_1m,
                cost_per_request=(cost / requests).quantize(Decimal("0.000000001")) if requests else None,
                input_per_1m=pin,
                output_per_1m=pout,
                tokens_in=tin,
                tokens_out=tout,
                eval_runs=ids,
                reused=all(s.reused for s in scores),
            )
        )
    return sorted(out, key=lambda a: a.deployment.slug)


def _versions(run: TrainingRun, option: dict[str, Any], workflows: list[Workflow]) -> list[dict[str, Any]]:
    volume, horizon = int(option["volume_tokens_per_month"]), int(option["horizon_months"])
    evaluations = {
        e.model_version_id: e for e in VersionEvaluation.objects.filter(run=run).select_related("deployment")
    }
    out = []
    for version in ModelVersion.objects.filter(run=run).select_related("registered_model").order_by("number"):
        evaluation = evaluations.get(version.pk)
        doc: dict[str, Any] = {
            "version": str(version),
            "number": version.number,
            "global_version": version.global_version,
            "final": version.final,
            "training_cost": _fixed(version.cost),
            "currency": version.currency,
            "state": evaluation.state if evaluation else "not requested",
            "error": evaluation.error if evaluation else "",
            "quality": {},
            "eval_runs": [],
            "deployment": None,
            "hosting_seconds": None,
            "hosting_cost": None,
            "tokens_served": None,
            "tokens_per_second": None,
            "hosting_per_1m": None,
            "amortised_per_1m": None,
        }
        if evaluation is not None and evaluation.state == VersionEvaluation.State.SUCCEEDED:
            scores = list(VersionScore.objects.filter(evaluation=evaluation))
            doc["eval_runs"] = [s.eval_run_id for s in scores]
            for workflow in workflows:
                mean = _mean_score([s.eval_run_id for s in scores if s.workflow_id == workflow.pk])
                if mean is not None:
                    doc["quality"][workflow.slug] = _fixed(mean)
            doc.update(
                deployment=evaluation.deployment.slug if evaluation.deployment else None,
                hosting_seconds=_fixed(evaluation.hosting_seconds),
                hosting_cost=_fixed(evaluation.hosting_cost),
                tokens_served=evaluation.tokens_served,
                # Measured throughput while scoring: tokens served per second of serving held.
                tokens_per_second=_fixed(
                    (Decimal(evaluation.tokens_served) / evaluation.hosting_seconds).quantize(Decimal("0.01"))
                )
                if evaluation.hosting_seconds > 0
                else None,
            )
            hosting = _hosting_per_1m(evaluation)
            if hosting is not None:
                doc["hosting_per_1m"] = _fixed(hosting)
                doc["amortised_per_1m"] = _fixed(
                    amortised_per_1m(
                        hosting_per_1m=hosting,
                        training_cost=version.cost,
                        horizon_months=horizon,
                        volume_tokens_per_month=volume,
                    )
                )
        out.append(doc)
    return out


def _hosting_per_1m(evaluation: VersionEvaluation) -> Decimal | None:
    """billing.selfhosted's $/1M for the version's deployment (None without a serve cluster)."""
    deployment = evaluation.deployment
    if deployment is None or deployment.hosting_cluster_id is None:
        return None
    figures = self_hosted_cost(deployment=deployment, since_day=deployment.created_at.date())
    return figures[0].per_1m_tokens if figures else None


def _forecast_doc(forecast: maths.Forecast) -> dict[str, Any]:
    return {
        "target_quality": _fixed(forecast.target),
        "cost": _text(forecast.cost),
        "low": _text(forecast.low),
        "high": _text(forecast.high),
        "already_met": forecast.already_met,
        "points": forecast.points,
        "reason": forecast.reason,
        "slope_per_e_fold": _text(forecast.fit.slope.quantize(QUALITY)) if forecast.fit else None,
        "interval": INTERVAL_NOTE,
        "fit": FIT_NOTE,
    }


def build_or_buy_report(*, run: TrainingRun) -> dict[str, Any]:
    """Everything the panel and GET /api/decisions/training-runs/<id>/build-or-buy/ show."""
    option = build_or_buy_option(run)
    spend = spend_total(subject_type=RUN_SUBJECT, subject_id=str(run.pk))
    evaluation_spend = UsageRecord.objects.filter(
        subject_type=RUN_SUBJECT, subject_id=str(run.pk), deployment__isnull=False
    ).aggregate(s=Sum("amount"))["s"] or Decimal(0)
    base: dict[str, Any] = {
        "run": run.pk,
        "enabled": option is not None,
        "currency": run.currency,
        "run_spend": _fixed(spend),
        "evaluation_spend": _fixed(evaluation_spend),
        "training_spend": _fixed(spend - evaluation_spend),
    }
    if option is None:
        return {**base, "option": None, "versions": [], "workflows": [], "stop_reason": ""}
    volume, horizon = int(option["volume_tokens_per_month"]), int(option["horizon_months"])
    workflows = list(Workflow.objects.filter(slug__in=option["workflows"]).order_by("slug"))
    versions = _versions(run, option, workflows)
    scored = [v for v in versions if v["state"] == VersionEvaluation.State.SUCCEEDED and v["quality"]]
    newest = scored[-1] if scored else None
    prices = PriceResolver()
    docs = []
    decisions = []
    for workflow in workflows:
        apis = _apis(run, workflow, prices)
        points = [
            (Decimal(v["training_cost"]), Decimal(v["quality"][workflow.slug]))
            for v in scored
            if workflow.slug in v["quality"]
        ]
        in_newest = newest is not None and workflow.slug in newest["quality"]
        decision = decide.workflow_decision(
            workflow=workflow.slug,
            option=option,
            apis=[decide.ApiFigure(slug=a.deployment.slug, quality=a.quality, per_1m=a.per_1m) for a in apis],
            points=points,
            newest_quality=Decimal(newest["quality"][workflow.slug]) if in_newest and newest else None,
            newest_cost=Decimal(newest["training_cost"]) if newest else Decimal(0),
            hosting_per_1m=Decimal(newest["hosting_per_1m"]) if newest and newest["hosting_per_1m"] else None,
        )
        decisions.append(decision)
        docs.append(
            {
                "workflow": workflow.slug,
                "apis": [a.doc() for a in apis],
                "best_api": decision.best.slug if decision.best else None,
                "compared_api": decision.compared.slug if decision.compared else None,
                "target_quality": _text(decision.target),
                "target": decision.target_name,
                "points": [{"cost": _fixed(c), "quality": _fixed(q)} for c, q in points],
                "forecast_best_api": _forecast_doc(decision.forecast_best)
                if decision.forecast_best
                else None,
                "break_even_tokens_per_month": decision.break_even_tokens_per_month,
                "break_even_reason": decision.break_even_reason,
                "training_cost_basis": decision.training_cost_basis,
                "own_monthly": _text(decision.own_monthly),
                "buy_monthly": _text(decision.buy_monthly),
                "buying_cheaper": decision.buying_cheaper,
            }
        )
    stop_reason = decide.stop_reason(
        option=option, decisions=decisions, newest=newest["version"] if newest else None
    )
    return {
        **base,
        "option": option,
        "volume_tokens_per_month": volume,
        "horizon_months": horizon,
        "versions": versions,
        "workflows": docs,
        "stop_reason": stop_reason,
    }
