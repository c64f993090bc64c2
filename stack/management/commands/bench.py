"""Benchmarks (they measure and print JSON; tests never assert on wall-clock time).

python manage.py bench diloco --quick --json var/bench-diloco.json
python manage.py bench ledger --rows 1000000 --json var/bench-ledger.json
python manage.py bench gateway --json var/bench-gateway.json
python manage.py bench training --json var/bench-training.json
python manage.py bench scale --params 5e7 --steps 20 --json var/bench-scale.json
python manage.py bench figures [--check]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError

# name -> "module:function" taking the benchmark's own argv and returning an exit code.
BENCHMARKS = {
    "diloco": "bench.diloco.run:main",
    "ledger": "bench.ledger.run:main",
    "gateway": "bench.gateway.run:main",
    "training": "bench.training.runs:main",
    "scale": "bench.scale.run:main",
    # Not a measurement: renders the docs' figure tables from the committed JSON (--check: compare).
    "figures": "bench.figures:main",
}


def _entry(name: str) -> Callable[[list[str]], int]:
    module, _, function = BENCHMARKS[name].partition(":")
    return getattr(import_module(module), function)  # type: ignore[no-any-return]


class Command(BaseCommand):
    help = f"Run a benchmark and print its JSON figures. Benchmarks: {', '.join(BENCHMARKS)}."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
        parser.add_argument("args", nargs="*", help="the benchmark's own options, e.g. --json PATH")

    def run_from_argv(self, argv: list[str]) -> None:
        # Pass every option after the benchmark's name through untouched, so each
        # benchmark's own --help and flags work as documented.
        if len(argv) >= 3 and argv[2] in BENCHMARKS:
            import django

            django.setup()
            name = argv[2]
            # The engine's CLI takes its benchmark name as the first argument.
            try:
                code = _entry(name)([name, *argv[3:]] if name == "diloco" else argv[3:])
            except OperationalError as exc:  # e.g. DATABASE_URL names a database not created yet
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                sys.stderr.write(f"manage.py bench {name}: the database is unavailable: {reason}\n")
                raise SystemExit(1) from None
            if code:
                raise SystemExit(code)
            return
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError(f"usage: manage.py bench {{{','.join(BENCHMARKS)}}} [options]")
