"""The objects the fuzzed roles meet, and the Schemathesis config that names them: the ids and
slugs it puts in paths, query strings and bodies name real objects half of the time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from billing.models import Budget, BudgetAlert, ExportJob, InvoiceImport, InvoiceLine, PriceBook, UsageRecord
from decisions.models import Recommendation
from inference.models import (
    BatchJob,
    ChaosConfig,
    EvalCase,
    EvalRun,
    EvalSet,
    InferenceRequest,
    QualityRecord,
)
from registry.models import FailoverEvent, Provider
from tests.factories import (
    fabricate_run,
    make_cluster,
    make_deployment,
    make_model,
    make_provider,
    make_workflow,
)
from tests.stack.api_fuzz.options import HOOKS, SEED, deep
from training.models import ProbeJob

# --- The seeded objects ------------------------------------------------------------------------


@dataclass
class World:
    """What the fuzzer may name: per dictionary, the ids or slugs of real objects."""

    dictionaries: dict[str, list[str | int]]


def seed_world(user: User, prefix: str) -> World:
    """One object of each kind the API addresses, owned by `user` where objects have owners."""
    now = timezone.now()
    provider = make_provider(slug=f"{prefix}-prov", kind=Provider.Kind.OPENAI_COMPATIBLE)
    cluster = make_cluster(slug=f"{prefix}-cl", provider=provider)
    model = make_model(slug=f"{prefix}-model")
    primary = make_deployment(slug=f"{prefix}-dep-a", model=model, provider=provider)
    backup = make_deployment(slug=f"{prefix}-dep-b", model=model, provider=provider)
    workflow = make_workflow(owner=user, slug=f"{prefix}-wf", deployments=[primary, backup])
    ChaosConfig.objects.create(deployment=backup, enabled=False, status_codes=[503])
    run = fabricate_run(name=f"{prefix}-run")
    budget = Budget.objects.create(
        name=f"{prefix}-budget",
        scope=Budget.Scope.WORKFLOW,
        workflow=workflow,
        limit_amount=Decimal("100"),
        thresholds=[50, 100],
    )
    alert = BudgetAlert.objects.create(
        budget=budget,
        period_start=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        threshold_percent=50,
        spent=Decimal("60"),
        limit_amount=Decimal("100"),
        triggered_at=now,
    )
    failover = FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.INFERENCE,
        from_provider=provider,
        to_provider=provider,
        from_deployment=primary,
        to_deployment=backup,
        reason="503 from the primary",
        detected_at=now,
        status_code=503,
    )
    probe = ProbeJob.objects.create(cluster=cluster, created_by=user, steps=10)
    eval_set = EvalSet.objects.create(workflow=workflow, name=f"{prefix}-evals", created_by=user)
    case = EvalCase.objects.create(eval_set=eval_set, prompt="2+2?", expected="4")
    eval_run = EvalRun.objects.create(eval_set=eval_set, deployment=primary, cases_total=1, created_by=user)
    request = InferenceRequest.objects.create(
        workflow=workflow, deployment=primary, status=InferenceRequest.Status.SUCCEEDED, tokens_in=3
    )
    QualityRecord.objects.create(
        deployment=primary,
        workflow=workflow,
        source=QualityRecord.Source.EVAL,
        score=Decimal("1"),
        eval_run=eval_run,
        eval_case=case,
    )
    batch = BatchJob.objects.create(
        workflow=workflow, input_uri=f"batch/{prefix}/input.jsonl", created_by=user
    )
    export = ExportJob.objects.create(created_by=user, formats=["csv"])
    invoice = InvoiceImport.objects.create(
        provider=provider,
        filename="invoice.csv",
        uploaded_by=user,
        period_start=timezone.now().date() - timedelta(days=30),
        period_end=timezone.now().date(),
        row_count=1,
    )
    InvoiceLine.objects.create(
        invoice=invoice,
        line_number=1,
        day=timezone.now().date(),
        service="inference",
        amount=Decimal("1.5"),
        currency="USD",
    )
    recommendation = Recommendation.objects.create(
        workflow=workflow,
        from_deployment=primary,
        to_deployment=backup,
        policy_version=workflow.policy_versions.order_by("-version").first(),
        summary=f"switch {workflow.slug}'s primary from {primary.slug} to {backup.slug}",
    )
    clusters = [cluster.slug, *run.learners.values_list("cluster__slug", flat=True)]
    return World(
        dictionaries={
            "providers": [provider.slug],
            "clusters": clusters,
            "models": [model.slug],
            "deployments": [primary.slug, backup.slug],
            "workflows": [workflow.slug],
            "batch_jobs": [batch.pk],
            "budget_alerts": [alert.pk],
            "budgets": [budget.pk],
            "eval_runs": [eval_run.pk],
            "eval_sets": [eval_set.pk],
            "export_jobs": [export.pk],
            "failover_events": [failover.pk],
            "invoice_imports": [invoice.pk],
            "price_books": list(PriceBook.objects.values_list("pk", flat=True)),
            "probe_jobs": [probe.pk],
            "training_runs": [run.pk],
            "usage_records": list(UsageRecord.objects.values_list("pk", flat=True)),
            "requests": [request.pk],
            "recommendations": [recommendation.pk],
        }
    )


# Path parameters, by the collection their path starts with, and the dictionary naming real ones.
PATH_DICTIONARIES = {
    "/api/providers/": ("slug", "providers"),
    "/api/clusters/": ("slug", "clusters"),
    "/api/models/": ("slug", "models"),
    "/api/deployments/": ("slug", "deployments"),
    "/api/chaos/": ("slug", "deployments"),
    "/api/workflows/": ("slug", "workflows"),
    "/api/batch-jobs/": ("id", "batch_jobs"),
    "/api/budget-alerts/": ("id", "budget_alerts"),
    "/api/budgets/": ("id", "budgets"),
    "/api/eval-runs/": ("id", "eval_runs"),
    "/api/eval-sets/": ("id", "eval_sets"),
    "/api/export-jobs/": ("id", "export_jobs"),
    "/api/failover-events/": ("id", "failover_events"),
    "/api/invoice-imports/": ("id", "invoice_imports"),
    "/api/price-books/": ("id", "price_books"),
    "/api/probe-jobs/": ("id", "probe_jobs"),
    "/api/training-runs/": ("id", "training_runs"),
    "/api/usage-records/": ("id", "usage_records"),
    "/api/recommendations/": ("id", "recommendations"),
}

# Fields of bodies and query strings that name other objects, everywhere they appear.
FIELD_DICTIONARIES = {
    "provider": "providers",
    "cluster": "clusters",
    "hosting_cluster": "clusters",
    "model": "models",
    "deployment": "deployments",
    "judge_deployment": "deployments",
    "deployments[*]": "deployments",
    "workflow": "workflows",
    "eval_set": "eval_sets",
    "budget": "budgets",
    "request_id": "requests",
    "training_run": "training_runs",
}


def toml(value: Any) -> str:
    """A TOML value: strings and numbers as JSON writes them (the same syntax for these), tables inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def schemathesis_config(world: World) -> str:
    """schemathesis.toml for one role's run: where real ids and slugs go.

    Each dictionary comes twice: as its values (ids are numbers in paths and bodies) and as text
    (`<name>_text`: every query parameter is text)."""
    half = 0.5
    lines = [f"seed = {SEED}", ""]
    if not deep():  # a deep run sends the coverage phase's bodies in every media type
        lines[1:1] = [f"hooks = {toml(str(HOOKS))}"]
    for name, values in world.dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {toml(values)}", ""]
        lines += [f"[dictionaries.{name}_text]", f"values = {toml([str(v) for v in values])}", ""]
    bindings: dict[str, Any] = {}
    for field, name in FIELD_DICTIONARIES.items():
        bindings[f"body.{field}"] = {"dictionary": name, "probability": half}
        if "[" not in field:
            bindings[f"query.{field}"] = {"dictionary": f"{name}_text", "probability": half}
    lines += ["[parameters]", *(f"{toml(k)} = {toml(v)}" for k, v in bindings.items()), ""]
    for prefix, (parameter, name) in PATH_DICTIONARIES.items():
        lines += [
            "[[operations]]",
            f"include-path-regex = {toml('^' + prefix + '{')}",
            f"parameters = {toml({f'path.{parameter}': {'dictionary': name, 'probability': half}})}",
            "",
        ]
    return "\n".join(lines)
