#!/usr/bin/env python
"""Django's command-line utility for Switchyard."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stack.settings")
    from django.core.management import execute_from_command_line

    from registry.audit.origin import Surface, set_process_origin

    # Changes made by commands that are not CheckedCommands (createsuperuser, changepassword,
    # loaddata) are audited as this command; requests and tasks it serves set their own origin.
    if len(sys.argv) > 1:
        set_process_origin(surface=Surface.COMMAND, label=f"command:{sys.argv[1][:100]}")

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
