"""`manage.py rollups update|rebuild`: maintain the daily rollups of the ledger."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from billing.rollups import rollups_rebuild, rollups_update


class Command(BaseCommand):
    help = "update: fold new ledger rows into the rollups; rebuild: recompute them from the whole ledger."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["update", "rebuild"])

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.perf_counter()
        folded = rollups_rebuild() if options["action"] == "rebuild" else rollups_update()
        self.stdout.write(
            f"folded {folded} ledger rows into daily rollups in {time.perf_counter() - started:.2f}s"
        )
