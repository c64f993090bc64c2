"""Launch a training run from a YAML or JSON config file and follow it until it ends.

python manage.py train --config run.yaml [--name NAME] [--user USERNAME] [--no-wait]

A bad config exits 1 with one readable line naming every field that is wrong; the run's
progress (state, versions, tokens, eval loss, cost) is printed every few seconds; the exit
status is 0 when the run succeeded and 1 otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from registry.cli import CheckedCommand
from registry.validation import (
    MAX_CONFIG_BYTES,
    InputError,
    float_parse,
    json_parse,
    text_check,
    yaml_parse,
)
from training.models import TrainingRun
from training.run_config import RunConfigError
from training.selectors import run_progress
from training.services import training_run_create


def _load(path: Path) -> Any:
    """The file's config: JSON for a .json file, else YAML; both bounded (size, depth, finite numbers)."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(f"larger than {MAX_CONFIG_BYTES} bytes")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        return json_parse(text, max_bytes=MAX_CONFIG_BYTES)
    return yaml_parse(text)


class Command(CheckedCommand):
    help = "Launch a DiLoCo training run from a YAML/JSON config and show its progress until it ends."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--config", required=True, help="YAML or JSON run config")
        parser.add_argument("--name", default="", help="run name (default: the file's stem)")
        parser.add_argument("--user", default="", help="username recorded as the run's creator")
        parser.add_argument("--no-wait", action="store_true", help="launch and exit without following")
        parser.add_argument(
            "--interval", default="3.0", help="seconds between progress lines (at least 0.2, at most 3600)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["config"])
        try:
            interval = max(0.2, float_parse(options["interval"], minimum=0.0, maximum=3600.0))
        except InputError as exc:
            raise CommandError(f"--interval: {exc}") from None
        try:
            raw = _load(path)
        except FileNotFoundError as exc:
            raise CommandError(f"{path}: no such file") from exc
        except InputError as exc:
            where = f"{exc.field}: " if exc.field else ""
            raise CommandError(f"{path}: not valid YAML/JSON: {where}{exc}".splitlines()[0]) from exc
        except (ValueError, OSError) as exc:  # not UTF-8 text; a directory, no permission
            raise CommandError(f"{path}: cannot read it: {exc}".splitlines()[0]) from exc
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=text_check(options["user"], field="user")).first()
            if user is None:
                raise CommandError(f"no user {options['user']!r}")
        try:
            run = training_run_create(config=raw, created_by=user, name=options["name"] or path.stem)
        except RunConfigError as exc:
            problems = "; ".join(f"{field}: {', '.join(msgs)}" for field, msgs in exc.errors.items())
            raise CommandError(f"invalid config {path}: {problems}") from exc
        self.stdout.write(f"run #{run.pk} {run.name} created ({run.state})")
        if options["no_wait"]:
            return
        last = ""
        while True:
            run.refresh_from_db()
            p = run_progress(run=run)
            loss = f"{p.eval_loss:.4f}" if p.eval_loss is not None else "-"
            line = (
                f"run #{run.pk} {p.state:<16} versions {p.versions:>4}  tokens {p.tokens:>12,}  "
                f"eval loss {loss}  cost {p.cost:.6f} {p.currency}"
            )
            if line != last:
                self.stdout.write(line)
                last = line
            if run.is_finished:
                break
            time.sleep(interval)
        self.stdout.write(f"run #{run.pk} {run.state}: {run.reason}")
        if run.state != TrainingRun.State.SUCCEEDED:
            raise SystemExit(1)
