"""The demo's cost-quality part (issue 18), run by `manage.py demo`.

1. Three loopback "API" providers (stack.demo.providers) serve the `ticket-labels` workflow
   (stack.demo.seed): acme-large (its primary), acme-small and acme-grader.
2. The demo's training run gets a build-or-buy option for that workflow: each registered
   version of the trained model is served and scored on the workflow's eval set beside the two
   API deployments, and its run page shows the panel.
3. The demo sends tickets through /v1 (the workflow keeps its prompts: it opted in), replays the
   kept requests through both deployments with acme-grader as the judge, and derives the
   recommendation, printed with its page.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from decisions.models import ReplayStudy
from decisions.recommendations.derive import LedgerPending, recommendations_from_study
from decisions.replay.services import replay_study_create
from inference.models import RetainedPrompt
from registry.models import Cluster, Deployment, Workflow
from registry.services import api_token_create
from stack.demo.providers import LabelProvider, demo_ticket, ticket_prompt
from stack.demo.seed import (
    FULL_SCALE,
    DemoScale,
    TicketProvider,
    demo_ticket_providers,
    demo_ticket_workflow_seed,
    loopback_port,
)
from stack.supervisor import Supervisor


@dataclass
class CostQualityDemo:
    admin: User
    specs: list[TicketProvider]
    servers: list[LabelProvider]
    workflow: Workflow
    # How many tickets to send and replay, how often to score the run's versions.
    scale: DemoScale = FULL_SCALE

    @classmethod
    def start(cls, *, admin: User, base_port: int, scale: DemoScale = FULL_SCALE) -> CostQualityDemo:
        """Start the loopback providers and seed their workflow."""
        specs = demo_ticket_providers(base_port=base_port)
        servers: list[LabelProvider] = []
        for spec in specs:
            try:
                server = LabelProvider(
                    name=spec.deployment_slug, error_share=spec.error_share, port=loopback_port(spec.port)
                )
            except OSError as exc:
                for started in servers:
                    started.stop()
                raise CommandError(
                    f"port {spec.port} (the demo's {spec.deployment_slug} provider): {exc}; pass another --port"
                ) from exc
            servers.append(server.start())
        # A busy port was swapped for a free one (loopback_port): seed the ports actually bound.
        specs = [replace(spec, port=server.port) for spec, server in zip(specs, servers, strict=True)]
        workflow = demo_ticket_workflow_seed(providers=specs, admin=admin, now=timezone.now())
        return cls(admin=admin, specs=specs, servers=servers, workflow=workflow, scale=scale)

    def run_options(self, cluster: Cluster) -> dict[str, Any]:
        """The training run's build-or-buy option: score its versions on ticket-labels.

        Every k-th global version is scored (and the final one): each scoring serves the
        version on the control worker."""
        return {
            "register_every_versions": self.scale.register_every_versions,
            "build_or_buy": {
                "workflows": [self.workflow.slug],
                "serve_cluster": cluster.slug,
                "volume_tokens_per_month": 50_000_000,
                "horizon_months": 12,
                "target_quality": None,
                "stop_when_buying_cheaper": False,
            },
        }

    def replay(self, cmd: BaseCommand, base: str, supervisor: Supervisor, *, deadline: float) -> None:
        """Send the tickets, replay them through both deployments and print the recommendation."""
        _, key = api_token_create(user=self.admin, name=f"demo tickets {timezone.now():%Y-%m-%d %H:%M:%S}")
        errors = 0
        tickets = self.scale.ticket_requests
        for n in range(tickets):
            text, _ = demo_ticket(n)
            body = json.dumps(
                {"model": self.workflow.slug, "messages": [{"role": "user", "content": ticket_prompt(text)}]}
            ).encode()
            request = urllib.request.Request(  # noqa: S310 (loopback)
                f"{base}/v1/chat/completions",
                data=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30):  # noqa: S310 (loopback)
                    pass
            except urllib.error.HTTPError as exc:
                errors += 1
                cmd.stdout.write(cmd.style.WARNING(f"ticket {n}: HTTP {exc.code}"))
        self._wait(
            lambda: RetainedPrompt.objects.filter(workflow=self.workflow).count() >= tickets - errors,
            supervisor,
            deadline,
            what="the tickets' kept prompts",
        )
        large, small, grader = (Deployment.objects.get(slug=s.deployment_slug) for s in self.specs)
        with transaction.atomic():
            study = replay_study_create(
                workflow=self.workflow,
                deployments=[small],
                user=self.admin,
                sample_size=tickets,
                scorer="judge",
                judge_deployment=grader,
            )
        cmd.stdout.write(
            f"{tickets - errors} tickets sent to {self.workflow.slug} (its prompts are kept 14 days); "
            f"replaying them through {large.slug} and {small.slug}, graded by {grader.slug}…"
        )
        self._wait(
            lambda: (
                ReplayStudy.objects.get(pk=study.pk).state
                not in (ReplayStudy.State.PENDING, ReplayStudy.State.RUNNING)
            ),
            supervisor,
            deadline,
            what=f"replay study #{study.pk}",
        )
        study.refresh_from_db()
        if study.state != ReplayStudy.State.SUCCEEDED:
            cmd.stdout.write(cmd.style.ERROR(f"replay study #{study.pk} {study.state}: {study.error}"))
            return
        while True:
            try:
                derivation = recommendations_from_study(study_id=study.pk)
                break
            except LedgerPending:
                if time.monotonic() > deadline:
                    raise CommandError(f"replay study #{study.pk}: its ledger rows did not arrive") from None
                supervisor.poll()
                time.sleep(1)
        cmd.stdout.write(f"  replay study: {base}/decisions/replays/{study.pk}/")
        for recommendation in derivation.recommendations:
            cmd.stdout.write(
                cmd.style.SUCCESS(f"recommendation #{recommendation.pk}: {recommendation.summary}")
            )
            cmd.stdout.write(f"  accept or dismiss it: {base}/decisions/recommendations/{recommendation.pk}/")
        if not derivation.recommendations:
            reasons = "; ".join(v.reason for v in derivation.verdicts) or "no verdict"
            cmd.stdout.write(cmd.style.WARNING(f"replay study #{study.pk} proposed no change ({reasons})"))

    def _wait(self, done: Callable[[], bool], supervisor: Supervisor, deadline: float, *, what: str) -> None:
        while not done():
            if time.monotonic() > deadline:
                raise CommandError(f"{what} did not arrive in time")
            supervisor.poll()
            time.sleep(0.5)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
