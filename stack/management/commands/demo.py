"""Run the whole demo stack: web, one worker per demo cluster, control worker, beat.

Seeds the demo registry, starts every process, waits until /healthz reports all
demo clusters healthy, runs a probe job on each cluster, then launches a DiLoCo
training run across both demo clusters. When the run succeeds its model is
served by two `serve_model` replicas (one per cluster) behind the `local-chat`
workflow, and a chaos drill (the primary failing half its calls) sends requests
through the /v1 gateway so failovers show on the workflow's page.

`--quick` runs every stage with less work in each (stack.demo.seed.QUICK_SCALE: shorter
probes, a 20-outer-step run, fewer tickets and drill requests); the integration test
tests/integration/test_demo_e2e.py runs it end to end. Each finished stage prints a line
`stage <name>: done` (probes, replay, training, serving, drill), so a script can follow it.

Every process runs under a `stack.supervisor.Supervisor`: one that exits is started
again with capped exponential backoff (1 s, doubling to 60 s), and one that crashes
five times in a row within a minute of starting is given up; each restart and the
giving up are printed. Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from billing.selectors import usage_for_subject
from inference.services import chaos_config_set
from registry.models import Deployment, Workflow
from registry.services import api_token_create
from stack.demo.cost_quality import CostQualityDemo
from stack.demo.seed import (
    FULL_SCALE,
    QUICK_SCALE,
    LocalReplica,
    demo_local_replicas,
    demo_local_workflow_seed,
    demo_stack_seed,
)
from stack.supervisor import Supervisor
from training.models import ProbeJob, TrainingRun
from training.run_config import demo_config
from training.services import probe_job_create, training_run_create


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Start the demo stack and run a probe job on each demo cluster (Ctrl-C stops it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--timeout", type=float, default=300.0, help="seconds to wait for health and probes"
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="stop after the training run and the local-model drill finish",
        )
        parser.add_argument(
            "--quick",
            action="store_true",
            help="run every stage, each with less work (a short DiLoCo run, fewer requests)",
        )
        parser.add_argument(
            "--run-timeout", type=float, default=900.0, help="with --once: seconds to wait for the run"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                raise CommandError(f"{host}:{port} is already in use; stop what runs there or pass --port")
        started = time.monotonic()
        scale = QUICK_SCALE if options["quick"] else FULL_SCALE
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        team_password = os.environ.get("DEMO_TEAM_PASSWORD") or secrets.token_urlsafe(12)
        stack = demo_stack_seed(admin_password=password, now=timezone.now(), team_password=team_password)
        # The loopback "API" providers of the cost-quality part: in this process, before the
        # run is created (its build-or-buy option names their workflow).
        cost_quality = CostQualityDemo.start(admin=stack.admin, base_port=port + 200, scale=scale)
        log_dir = Path(settings.VAR_DIR) / "demo-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        commands = {
            "web": [*manage, "runserver", f"{host}:{port}", "--noreload"],
            "control": [*manage, "worker", "--control", "--loglevel", "warning"],
            "beat": [*manage, "beat", "--loglevel", "warning"],
        }
        for cluster in stack.clusters:
            commands[f"worker-{cluster.slug}"] = [
                *manage,
                "worker",
                "--cluster",
                cluster.slug,
                "--loglevel",
                "warning",
            ]
        supervisor = Supervisor(say=lambda line: self.stdout.write(self.style.WARNING(line)))
        # Stop the children on Ctrl-C, on `kill` and when the terminal closes.
        # (SIGINT is set explicitly: a shell starts background jobs with it ignored.)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)
        try:
            for name, argv in commands.items():
                child = supervisor.start(name, argv, log_path=log_dir / f"{name}.log")
                self.stdout.write(f"started {name} (pid {child.pid}), log {child.log_path}")
            base = f"http://{host}:{port}"
            # /healthz shows cluster detail to admins only.
            _, health_token = api_token_create(
                user=stack.admin, name=f"demo health {timezone.now():%Y-%m-%d %H:%M:%S}"
            )
            self._wait_healthy(base, health_token, supervisor, deadline=started + options["timeout"])
            self.stdout.write(self.style.SUCCESS(f"stack healthy after {time.monotonic() - started:.1f}s"))
            with transaction.atomic():
                jobs = [
                    probe_job_create(cluster=c, created_by=stack.admin, steps=scale.probe_steps)
                    for c in stack.clusters
                ]
            self._wait_jobs([j.pk for j in jobs], supervisor, deadline=started + options["timeout"])
            _stage_done(self, "probes")
            with transaction.atomic():
                run = training_run_create(
                    # The platform team's run, its versions scored against buying (build or buy).
                    config={
                        **demo_config(),
                        **scale.run,
                        "team": "platform",
                        **cost_quality.run_options(stack.clusters[0]),
                    },
                    created_by=stack.admin,
                    name=f"demo-diloco-{timezone.now():%H%M%S}",
                )
            self.stdout.write("")
            self.stdout.write(self.style.SUCCESS(f"Switchyard is running at {base}/"))
            self.stdout.write(f"  log in as: admin / {password}")
            for username in stack.team_users:
                self.stdout.write(f"  or, seeing one team only: {username} / {team_password}")
            self.stdout.write(
                f"  training:  {base}/training/{run.pk}/  (DiLoCo run #{run.pk} across both clusters)"
            )
            self.stdout.write(f"  health:    {base}/healthz     API schema: {base}/api/schema/")
            self.stdout.write(f"  logs:      {log_dir}")
            cost_quality.replay(self, base, supervisor, deadline=time.monotonic() + options["timeout"])
            _stage_done(self, "replay")
            self.stdout.write(
                f"  build or buy: {base}/training/{run.pk}/ (the panel fills in as versions are scored)"
            )
            self.stdout.write("Press Ctrl-C to stop.")
            drill = _Drill(
                run_id=run.pk,
                base=base,
                port=port,
                manage=manage,
                log_dir=log_dir,
                requests=scale.drill_requests,
            )
            run_deadline = time.monotonic() + options["run_timeout"]
            while True:
                outcome = drill.step(self, stack.admin, supervisor)
                if options["once"] and outcome is not None:
                    if outcome != "drilled":
                        raise CommandError(f"demo run #{run.pk} ended {outcome}")
                    return
                if options["once"] and time.monotonic() > run_deadline:
                    raise CommandError(f"demo run #{run.pk} did not finish in {options['run_timeout']:.0f}s")
                # A crashed process is started again after its backoff; the others keep running.
                supervisor.poll()
                time.sleep(1)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            for name in supervisor.stop_all():
                self.stdout.write(f"stopped {name}")
            cost_quality.stop()

    def _wait_healthy(self, base: str, token: str, supervisor: Supervisor, deadline: float) -> None:
        last = ""
        headers = {"Authorization": f"Bearer {token}"}
        request = urllib.request.Request(f"{base}/healthz", headers=headers)  # noqa: S310 (loopback)
        while time.monotonic() < deadline:
            _supervise(supervisor)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
                    body = json.load(response)
                if body["ok"] and body["all_clusters_healthy"]:
                    return
                last = ", ".join(f"{c['slug']}={c['status']}" for c in body["clusters"])
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = str(exc)
            time.sleep(1)
        raise CommandError(f"the stack did not become healthy in time (last: {last})")

    def _wait_jobs(self, job_ids: list[int], supervisor: Supervisor, deadline: float) -> None:
        pending = set(job_ids)
        while pending and time.monotonic() < deadline:
            _supervise(supervisor)
            for job in ProbeJob.objects.filter(pk__in=pending).select_related("cluster"):
                if not job.is_finished:
                    continue
                pending.discard(job.pk)
                usage = usage_for_subject(subject_type="probe_job", subject_id=str(job.pk)).first()
                billed = (
                    f"billed {usage.amount:.6f} {usage.currency} at price v{usage.price_book.version} "
                    f"({usage.unit_price}/{usage.unit})"
                    if usage
                    else "not billed"
                )
                line = (
                    f"probe #{job.pk} on {job.cluster.slug}: {job.status}, "
                    f"loss {job.loss_curve[0][1] if job.loss_curve else float('nan'):.3f} → "
                    f"{job.final_loss if job.final_loss is not None else float('nan'):.3f}, "
                    f"{job.accelerator_seconds} accelerator-s, {billed}"
                )
                style = self.style.SUCCESS if job.status == ProbeJob.Status.SUCCEEDED else self.style.ERROR
                self.stdout.write(style(line))
            time.sleep(1)
        if pending:
            raise CommandError(f"probe jobs {sorted(pending)} did not finish in time")


def _stage_done(cmd: BaseCommand, stage: str) -> None:
    """The line a script following the demo waits for (tests/integration/test_demo_e2e.py)."""
    cmd.stdout.write(f"stage {stage}: done")


def _supervise(supervisor: Supervisor) -> None:
    """Restart what crashed while the demo waits; stop waiting once a process was given up."""
    supervisor.poll()
    lost = [c.name for c in supervisor.children.values() if c.gave_up]
    if lost:
        raise CommandError(f"{', '.join(lost)} kept crashing during start-up; see its log")


class _Drill:
    """Follows the demo's training run; once it succeeds, serves its model and runs the chaos drill."""

    def __init__(
        self, *, run_id: int, base: str, port: int, manage: list[str], log_dir: Path, requests: int
    ) -> None:
        self.run_id = run_id
        self.requests = requests
        self.base = base
        self.replica_base_port = port + 100
        self.replicas: list[LocalReplica] = []
        self.manage = manage
        self.log_dir = log_dir
        self.outcome: str | None = None
        self.last_line = ""

    def step(self, cmd: BaseCommand, admin: Any, supervisor: Supervisor) -> str | None:
        """Advance by one poll; returns the outcome ("drilled" or the run's final state) once known."""
        if self.outcome is not None:
            return self.outcome
        run = TrainingRun.objects.select_related("registered_model").get(pk=self.run_id)
        line = f"run #{run.pk}: {run.state}"
        if line != self.last_line:
            cmd.stdout.write(line + (f" ({run.reason})" if run.reason else ""))
            self.last_line = line
        if run.state in (
            TrainingRun.State.FAILED,
            TrainingRun.State.CANCELLED,
            TrainingRun.State.BUDGET_EXHAUSTED,
        ):
            self.outcome = str(run.state)
            return self.outcome
        if run.state != TrainingRun.State.SUCCEEDED or run.registered_model is None:
            return None
        model = run.registered_model
        cmd.stdout.write(
            cmd.style.SUCCESS(
                f"run #{run.pk} succeeded: eval loss {run.initial_eval_loss:.3f} → {run.final_eval_loss:.3f}, "
                f"registered model {model.slug}"
            )
        )
        _stage_done(cmd, "training")
        # Ports are picked now, just before the replicas start, not when the demo began.
        self.replicas = demo_local_replicas(base_port=self.replica_base_port)
        workflow = demo_local_workflow_seed(
            model=model, replicas=self.replicas, admin=admin, now=timezone.now()
        )
        for replica in self.replicas:
            name = f"serve-{replica.deployment_slug}"
            argv = [
                *self.manage,
                "serve_model",
                "--model",
                model.slug,
                "--port",
                str(replica.port),
                "--deployment",
                replica.deployment_slug,
            ]
            child = supervisor.start(name, argv, log_path=self.log_dir / f"{name}.log")
            cmd.stdout.write(f"started {name} (pid {child.pid}) on port {replica.port}")
        for replica in self.replicas:
            _wait_http(f"http://127.0.0.1:{replica.port}/v1/models", timeout=60, supervisor=supervisor)
        _stage_done(cmd, "serving")
        self._chaos_drill(cmd, admin, workflow)
        _stage_done(cmd, "drill")
        self.outcome = "drilled"
        return self.outcome

    def _chaos_drill(self, cmd: BaseCommand, admin: Any, workflow: Workflow) -> None:
        primary = Deployment.objects.get(slug=self.replicas[0].deployment_slug)
        chaos_config_set(deployment=primary, enabled=True, user=admin, error_rate=0.5, status_codes=[503])
        _, key = api_token_create(user=admin, name=f"demo drill {timezone.now():%Y-%m-%d %H:%M:%S}")
        answered: dict[str, int] = {}
        errors = 0
        for i in range(self.requests):
            body = json.dumps(
                {
                    "model": workflow.slug,
                    "messages": [{"role": "user", "content": f"def handler_{i}(request):"}],
                    "max_tokens": 24,
                }
            ).encode()
            request = urllib.request.Request(  # noqa: S310 (loopback)
                f"{self.base}/v1/chat/completions",
                data=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (loopback)
                    who = response.headers.get("x-switchyard-deployment", "?")
                    answered[who] = answered.get(who, 0) + 1
            except urllib.error.HTTPError as exc:
                errors += 1
                cmd.stdout.write(cmd.style.WARNING(f"drill request {i}: HTTP {exc.code}"))
        cmd.stdout.write(
            cmd.style.SUCCESS(
                f"chaos drill on {workflow.slug} ({primary.slug} failing 50% with 503): "
                f"{self.requests - errors}/{self.requests} answered "
                f"({', '.join(f'{k}: {v}' for k, v in sorted(answered.items()))}); "
                f"see {self.base}/inference/workflows/{workflow.slug}/"
            )
        )


def _wait_http(url: str, *, timeout: float, supervisor: Supervisor | None = None) -> None:
    """Wait until `url` answers; with a supervisor, stop early once one of its children was given up."""
    deadline = time.monotonic() + timeout
    while True:
        if supervisor is not None:
            _supervise(supervisor)
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 (loopback)
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise CommandError(f"{url} did not answer in {timeout:.0f}s") from None
            time.sleep(0.5)
