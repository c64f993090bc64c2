"""Benchmarks (they measure and print JSON; tests never assert on wall-clock time).

python manage.py bench diloco --quick --json var/bench-diloco.json
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Run a benchmark and print its JSON figures. Benchmarks: diloco."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("benchmark", choices=["diloco"])
        parser.add_argument(
            "args", nargs="*", help="options passed to the benchmark, e.g. --quick --json PATH"
        )

    def run_from_argv(self, argv: list[str]) -> None:
        # Pass every option after the benchmark's name through untouched, so the
        # benchmark's own --help and flags work as documented.
        if len(argv) >= 3 and argv[2] == "diloco":
            from training.engine.bench import main

            code = main(["diloco", *argv[3:]])
            if code:
                raise SystemExit(code)
            return
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError("usage: manage.py bench diloco [--quick | --full] [--json PATH]")
