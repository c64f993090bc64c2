"""`manage.py prices import FILE [--format csv|json]`: import price versions (all or none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.price_import import FileImportError, decode_upload, price_import_file, price_import_format_for
from registry.cli import CheckedCommand

MAX_ERRORS_SHOWN = 20


class Command(CheckedCommand):
    help = "Price books. import: add price versions from a CSV or provider catalog (JSON) file."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        load = sub.add_parser("import", help="import price versions; nothing is imported if any row is bad")
        load.add_argument("file", type=Path)
        load.add_argument("--format", choices=["csv", "json"], help="default: from the file name")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            text = decode_upload(path.read_bytes())
            result = price_import_file(
                text=text, file_format=price_import_format_for(path.name, options["format"])
            )
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except FileImportError as exc:
            write_errors(self, exc)
            raise CommandError(f"{path}: {exc}") from None
        self.stdout.write(
            f"imported {len(result.created)} price version(s) from {path}"
            + (f"; {result.unchanged} already present" if result.unchanged else "")
        )
        for price in result.created:
            self.stdout.write(f"  {price}")


def write_errors(command: BaseCommand, exc: FileImportError) -> None:
    for error in exc.errors[:MAX_ERRORS_SHOWN]:
        command.stderr.write(str(error))
    if len(exc.errors) > MAX_ERRORS_SHOWN:
        command.stderr.write(f"... and {len(exc.errors) - MAX_ERRORS_SHOWN} more")
