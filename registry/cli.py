"""The base of the project's management commands: a refused input ends as one readable line.

Django prints a CommandError as "CommandError: <message>" and exits 1; any other exception is a
traceback. Every refusal of a business rule or of an input check is a DomainError
(registry.errors; the input checks' InputError is one), so commands built on
`CheckedCommand` turn those into a CommandError: a bad file, value or config never ends in a
traceback, whichever service refused it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from registry.audit.origin import Surface, audit_origin
from registry.errors import DomainError


class CheckedCommand(BaseCommand):
    def execute(self, *args: Any, **options: Any) -> str | None:
        name = type(self).__module__.rsplit(".", 1)[-1]
        try:
            # Changes a command makes are audited as "command:<name>" (registry.audit).
            with audit_origin(surface=Surface.COMMAND, label=f"command:{name}"):
                return super().execute(*args, **options)
        except DomainError as exc:
            field = f"{exc.field}: " if exc.field and exc.field not in str(exc) else ""
            raise CommandError(" ".join(f"{field}{exc}".split())) from exc
