"""`manage.py cache_study --workflow SLUG`: semantic matching's hit and false-hit rates on the
workflow's eval sets at several thresholds, as JSON (inference.quality.cache_study)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.models import EvalCase
from inference.quality.cache_study import DEFAULT_THRESHOLDS, StudyError, semantic_cache_study
from registry.models import Deployment, Workflow


def _thresholds(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CommandError(f"--thresholds: not numbers: {text!r}") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise CommandError("--thresholds: give cosine similarities above 0 and at most 1, comma-separated")
    return values


class Command(BaseCommand):
    help = (
        "Measure semantic cache matching on a workflow's eval sets before turning it on: for each "
        "threshold, how many cases another case's cached answer would serve, and how many of those "
        "expect another answer. Each embedding is a billed request of the workflow."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workflow", required=True, help="the workflow's slug")
        parser.add_argument("--eval-set", help="one eval set by name (default: all of the workflow's)")
        parser.add_argument(
            "--deployment",
            help="the embeddings deployment (default: the workflow's semantic_cache_deployment)",
        )
        parser.add_argument(
            "--thresholds",
            default=",".join(str(t) for t in DEFAULT_THRESHOLDS),
            help="comma-separated cosine similarities (default %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workflow = Workflow.objects.filter(slug=options["workflow"]).first()
        if workflow is None:
            raise CommandError(f"no workflow {options['workflow']!r}")
        if options["deployment"]:
            embedder = Deployment.objects.filter(slug=options["deployment"]).first()
            if embedder is None:
                raise CommandError(f"no deployment {options['deployment']!r}")
        else:
            embedder = workflow.semantic_cache_deployment
            if embedder is None:
                raise CommandError(
                    f"workflow {workflow.slug} has no embeddings deployment: pass --deployment"
                )
        if not embedder.supports_embeddings:
            raise CommandError(f"deployment {embedder.slug} does not serve embeddings")
        cases = EvalCase.objects.filter(eval_set__workflow=workflow).order_by(
            "eval_set__name", "position", "pk"
        )
        if options["eval_set"]:
            cases = cases.filter(eval_set__name=options["eval_set"])
        try:
            study = semantic_cache_study(
                workflow=workflow,
                embedder=embedder,
                cases=list(cases),
                thresholds=_thresholds(options["thresholds"]),
            )
        except StudyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(study, indent=2))
