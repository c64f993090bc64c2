"""WSGI entry point (gunicorn stack.wsgi:application).

A path under /v1 goes to the gateway's data plane (stack.dataplane: security headers, the body
limit, OpenAI-shaped errors, the Host check, then the view); everything else to Django's handler
with the full middleware chain (sessions, CSRF, auth, messages, login throttling, ...).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application

from stack.dataplane import DataPlaneHandler, is_data_plane

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stack.settings")
pages = get_wsgi_application()  # sets Django up
data_plane = DataPlaneHandler()


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if is_data_plane(environ.get("PATH_INFO", "")):
        return data_plane(environ, start_response)
    return pages(environ, start_response)
