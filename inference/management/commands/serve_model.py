"""python manage.py serve_model --model <slug> --port N: an OpenAI-compatible server for a
registered model's artifact (inference.local_serving)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stack.models import RegisteredModel
from training.artifacts import ArtifactError


class Command(BaseCommand):
    help = "Serve a registered model artifact over the OpenAI-compatible HTTP API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", required=True, help="slug of the RegisteredModel")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")

    def handle(self, *args: Any, **options: Any) -> None:
        from inference.local_serving import local_server_for_artifact

        model = RegisteredModel.objects.filter(slug=options["model"]).first()
        if model is None:
            raise CommandError(f"no registered model {options['model']!r}")
        if not model.artifact_uri:
            raise CommandError(f"model {model.slug} has no artifact_uri; train or register one first")
        if not 0 < options["port"] < 65536:
            raise CommandError("--port must be 1..65535")
        import torch

        torch.set_num_threads(max(1, options["threads"]))
        try:
            server = local_server_for_artifact(
                uri=model.artifact_uri, name=model.slug, host=options["host"], port=options["port"]
            )
        except (ArtifactError, OSError) as exc:
            raise CommandError(f"cannot serve {model.slug}: {exc}") from exc
        host, port = server.server_address[:2]
        shown = host.decode() if isinstance(host, bytes) else host
        self.stdout.write(f"serving {model.slug} on http://{shown}:{port}/v1", ending="\n")
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
