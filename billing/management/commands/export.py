"""`manage.py export`: cost-audit exports on the command line.

python manage.py export run --format csv --format parquet --start 2026-05-01 --end 2026-06-01 --out DIR
python manage.py export verify --manifest DIR/manifest.json [--dir DIR] [--public-key KEY.pem ...]
python manage.py export public-key [--json]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from billing.exports import (
    FILTER_FIELDS,
    FORMATS,
    MANIFEST_NAME,
    ExportFilterError,
    export_filters_parse,
    export_public_keys,
    export_public_keys_json,
    export_verify,
    export_write_files,
    public_keys_from_pem_files,
)
from registry.cli import CheckedCommand


class Command(CheckedCommand):
    help = (
        "Cost-audit exports. run: write an export and its signed manifest to a directory. "
        "verify: check a downloaded export against its manifest. "
        "public-key: print the public key that verifies new exports (--json: every key, retired ones too)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser(
            "verify", help="check the signature, each file's sha256 and size, rows and totals"
        )
        verify.add_argument("--manifest", required=True, type=Path, help="path to manifest.json")
        verify.add_argument("--dir", type=Path, help="where the files are (default: the manifest's folder)")
        verify.add_argument(
            "--public-key",
            action="append",
            type=Path,
            help="an Ed25519 public key (PEM) to check with, repeatable (default: this server's current and retired keys)",
        )
        public_key = sub.add_parser("public-key", help="print the export signing public key (PEM)")
        public_key.add_argument(
            "--json", action="store_true", help="the key set as served: current and retired keys, with ids"
        )
        run = sub.add_parser("run", help="write an export (files + manifest.json) into a directory")
        run.add_argument("--format", action="append", choices=FORMATS, help="repeatable; default: all three")
        run.add_argument("--out", required=True, type=Path, help="output directory")
        for name in FILTER_FIELDS:
            run.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "verify":
            self._verify(options["manifest"], options["dir"], options["public_key"])
        elif options["action"] == "public-key":
            self._public_key(as_json=options["json"])
        else:
            self._run(options)

    def _public_key(self, *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps(export_public_keys_json(), indent=2))
            return
        current = export_public_keys()[0]
        # The PEM alone on stdout (`> key.pem` gives a file the verify script reads); its id on stderr.
        self.stderr.write(f"export signing key {current.key_id} (Ed25519)")
        self.stdout.write(current.pem(), ending="")

    def _verify(self, manifest: Path, directory: Path | None, key_files: list[Path] | None) -> None:
        keys = None
        if key_files:
            try:
                keys = public_keys_from_pem_files(key_files)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read the public key: {exc}") from None
        checks = export_verify(manifest_path=manifest, directory=directory, public_keys=keys)
        for check in checks:
            self.stdout.write(check.line())
        failed = [c for c in checks if not c.ok]
        if failed:
            raise CommandError(
                f"export does not match its manifest: {failed[0].name}: {failed[0].detail}"
                + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
            )
        self.stdout.write(f"export verified: {len(checks)} checks passed")

    def _run(self, options: dict[str, Any]) -> None:
        params = {name: options[name] for name in FILTER_FIELDS if options.get(name)}
        try:
            filters = export_filters_parse(params=params)
        except ExportFilterError as exc:
            raise CommandError(f"bad filters: {exc}") from None
        try:
            manifest = export_write_files(
                filters=filters, formats=options["format"] or FORMATS, directory=options["out"]
            )
        except OSError as exc:
            raise CommandError(f"cannot write to {options['out']}: {exc.strerror or exc}") from None
        totals = ", ".join(f"{c} {t}" for c, t in manifest["totals"].items()) or "nothing"
        heads = ", ".join(f"{p} {h['sequence']}" for p, h in manifest["heads"].items()) or "none"
        self.stdout.write(
            f"{manifest['row_count']} rows as of the ledger heads ({heads}), "
            f"totals {totals}: {', '.join(manifest['files'])} and {MANIFEST_NAME} in {options['out']}"
        )
