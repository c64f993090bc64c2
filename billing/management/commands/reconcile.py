"""`manage.py reconcile import --provider SLUG FILE [--tolerance 0.01]`: compare an invoice with the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from billing.management.commands.prices import write_errors
from billing.price_import import FileImportError, decode_upload
from billing.reconciliation import (
    DEFAULT_TOLERANCE,
    reconciliation_import,
    reconciliation_result,
    tolerance_parse,
)
from registry.cli import CheckedCommand
from registry.models import Provider
from registry.validation import text_check


class Command(CheckedCommand):
    help = "Reconciliation. import: store a provider invoice / cost report CSV and print where it differs."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        load = sub.add_parser("import", help="import an invoice CSV; nothing is imported if any line is bad")
        load.add_argument("file", type=Path)
        load.add_argument("--provider", required=True, help="the provider's slug")
        load.add_argument("--tolerance", default=str(DEFAULT_TOLERANCE), help="default 0.01")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        tolerance = tolerance_parse(options["tolerance"])
        provider = Provider.objects.filter(slug=text_check(options["provider"], field="provider")).first()
        if provider is None:
            raise CommandError(f"no provider with slug {options['provider']!r}")
        try:
            invoice = reconciliation_import(
                provider=provider,
                filename=path.name,
                text=decode_upload(path.read_bytes()),
                tolerance=tolerance,
            )
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except FileImportError as exc:
            write_errors(self, exc)
            raise CommandError(f"{path}: {exc}") from None
        result = reconciliation_result(invoice=invoice)
        self.stdout.write(
            f"invoice import #{invoice.pk}: {invoice.row_count} lines, {invoice.period_start} to "
            f"{invoice.period_end}; invoice {result.invoice_total:f} {result.currency}, "
            f"ledger {result.ledger_total:f} {result.currency}, tolerance {invoice.tolerance}"
        )
        for title, cells in (("resource", result.mismatches), ("service", result.service_mismatches)):
            self.stdout.write(f"{len(cells)} (day, {title}) difference(s) beyond the tolerance")
            for cell in cells:
                self.stdout.write(
                    f"  {cell.day} {cell.key or '(no resource)'}: invoice {cell.invoice_amount:f} "
                    f"ledger {cell.ledger_amount:f} difference {cell.difference:f}"
                )
        for currency, amount in sorted(result.other_currencies.items()):
            self.stdout.write(f"not compared: ledger has {amount:f} {currency} for this provider and period")
