"""`manage.py journal status|fold`: the request journal (inference.recording.journal)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from inference.recording import journal_fold_all, journal_status


class Command(BaseCommand):
    help = (
        "The request journal. status: what is pending and what failed to fold. "
        "fold: fold every pending entry into the ledger now (--retry-failed: failed ones too)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("status", help="pending and failed journal entries, as JSON")
        fold = sub.add_parser("fold", help="fold pending journal entries into the ledger")
        fold.add_argument("--retry-failed", action="store_true", help="also retry entries whose fold failed")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "fold":
            folded = journal_fold_all(retry_failed=options["retry_failed"])
            self.stdout.write(f"folded {folded} journal entries")
        self.stdout.write(json.dumps(journal_status()))
