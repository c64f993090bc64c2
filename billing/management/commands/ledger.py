"""`manage.py ledger verify`: check the usage ledger's hash chain."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.models import LEDGER_PARTITION, LedgerHead
from billing.selectors import ledger_verify


class Command(BaseCommand):
    help = "Ledger tools. verify: walk the hash chain and name the first row that does not match."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser("verify", help="verify every partition's hash chain")
        verify.add_argument("--partition", help="only this partition")
        verify.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        partitions = (
            [options["partition"]]
            if options["partition"]
            else list(LedgerHead.objects.order_by("partition").values_list("partition", flat=True))
            or [LEDGER_PARTITION]
        )
        failures = []
        for partition in partitions:
            started = time.perf_counter()
            result = ledger_verify(partition=partition)
            seconds = time.perf_counter() - started
            if options["json"]:
                self.stdout.write(json.dumps({**result.__dict__, "seconds": round(seconds, 3)}))
            elif result.ok:
                self.stdout.write(
                    f"ledger {partition}: {result.rows_checked} rows, chain intact ({seconds:.2f}s)"
                )
            if not result.ok:
                failures.append(
                    f"ledger {partition}: row id={result.first_bad_id} sequence={result.first_bad_sequence}: "
                    f"{result.problem} ({result.rows_checked} rows before it are intact)"
                )
        if failures:
            raise CommandError("; ".join(failures))
