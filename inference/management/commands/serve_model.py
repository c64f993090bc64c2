"""python manage.py serve_model --model <slug> --port N: an OpenAI-compatible server for a
registered model's artifact: a switchyard artifact or an open-weights directory such as a
training run's final export (inference.serving.local)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from inference.serving.hosting import hosting_interval_bill
from inference.serving.local import local_server_for_artifact
from registry.models import Deployment, RegisteredModel
from storage.artifacts import ArtifactError


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Serve a registered model artifact over the OpenAI-compatible HTTP API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", required=True, help="slug of the RegisteredModel")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
        parser.add_argument(
            "--deployment",
            help="bill this deployment's hosting cluster for the time the server runs (accelerator-hours)",
        )
        parser.add_argument("--accelerators", type=int, default=1, help="accelerators the server holds")
        parser.add_argument("--bill-every", type=float, default=60.0, help="seconds between hosting bills")

    def handle(self, *args: Any, **options: Any) -> None:
        model = RegisteredModel.objects.filter(slug=options["model"]).first()
        if model is None:
            raise CommandError(f"no registered model {options['model']!r}")
        if not model.artifact_uri:
            raise CommandError(f"model {model.slug} has no artifact_uri; train or register one first")
        if not 0 < options["port"] < 65536:
            raise CommandError("--port must be 1..65535")
        deployment = None
        if options["deployment"]:
            deployment = (
                Deployment.objects.select_related("hosting_cluster", "model")
                .filter(slug=options["deployment"])
                .first()
            )
            if deployment is None or deployment.hosting_cluster_id is None:
                raise CommandError(f"no deployment {options['deployment']!r} with a hosting cluster")
            if options["accelerators"] < 1 or options["bill_every"] <= 0:
                raise CommandError("--accelerators must be >= 1 and --bill-every > 0")
        import torch  # slow to import: only once the arguments are checked

        torch.set_num_threads(max(1, options["threads"]))
        try:
            server = local_server_for_artifact(
                uri=model.artifact_uri, name=model.slug, host=options["host"], port=options["port"]
            )
        except (
            ArtifactError,
            ValueError,
            OSError,
        ) as exc:  # ValueError: the engine's config/tokenizer errors
            raise CommandError(f"cannot serve {model.slug}: {exc}") from exc
        host, port = server.server_address[:2]
        shown = host.decode() if isinstance(host, bytes) else host
        self.stdout.write(f"serving {model.slug} on http://{shown}:{port}/v1", ending="\n")
        self.stdout.flush()
        # SIGTERM (the demo's and systemd's stop) ends serve_forever like Ctrl-C, so the last
        # hosting interval is billed before exit.
        signal.signal(signal.SIGTERM, _interrupt)
        stop = threading.Event()
        biller = None
        if deployment is not None:
            biller = threading.Thread(
                target=self._bill_hosting,
                args=(deployment, options["accelerators"], options["bill_every"], stop),
                name="hosting-biller",
                daemon=True,
            )
            biller.start()
        try:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C or SIGTERM: a normal stop
                server.serve_forever()
        finally:
            server.server_close()
            stop.set()
            if biller is not None:
                biller.join(timeout=10)

    def _bill_hosting(
        self, deployment: Deployment, accelerators: int, every: float, stop: threading.Event
    ) -> None:
        """Bill each interval as it ends, and the last part on shutdown (SIGTERM/Ctrl-C)."""
        started = timezone.now()
        while True:
            stopping = stop.wait(every)
            now = timezone.now()
            try:
                hosting_interval_bill(
                    deployment=deployment, started_at=started, ended_at=now, accelerators=accelerators
                )
                started = now
            except Exception as exc:  # keep serving; the next interval retries from `started`
                self.stderr.write(f"hosting bill failed (retrying next interval): {exc}")
            finally:
                close_old_connections()
            if stopping:
                return
