"""Where a change comes from, for the audit trail (registry.audit): the surface and the actor,
carried in a ContextVar. It lives in the registry so that every app's commands can set it.

Entry points set it, each with one ContextVar set and reset and no query (the middleware for
pages, /api/, /v1 and admin; CheckedCommand and manage.py for commands; Celery's task signals for
tasks); the audit row reads it only when a tracked object is written. A write with no origin set
(a shell, a migration) is recorded as "system".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any


class Surface:
    WEB = "web"
    API = "api"
    GATEWAY = "gateway"
    ADMIN = "admin"
    COMMAND = "command"
    TASK = "task"
    SYSTEM = "system"

    choices = (
        (WEB, "web page"),
        (API, "REST API"),
        (GATEWAY, "/v1 gateway"),
        (ADMIN, "admin"),
        (COMMAND, "management command"),
        (TASK, "Celery task"),
        (SYSTEM, "system"),
    )


@dataclass(frozen=True)
class Origin:
    surface: str
    # Who, when no user is signed in: "command:<name>", "task:<name>" or "system".
    label: str = "system"
    # The request of a page or API call; its user is read only when a row is written (DRF's
    # token authentication sets request.user on the Django request too).
    request: Any = None


SYSTEM = Origin(surface=Surface.SYSTEM)
_origin: ContextVar[Origin | None] = ContextVar("switchyard_audit_origin", default=None)
# The request being served (pages, /api/, /v1, admin): the middleware sets only this, so a request
# costs one ContextVar set and reset; its surface and user are worked out when a row is written.
_request: ContextVar[Any] = ContextVar("switchyard_audit_request", default=None)
# The whole process's origin for manage.py commands that are not CheckedCommands (Django's own:
# createsuperuser, changepassword, loaddata). Threads start with an empty context, so this is the
# fallback, not a ContextVar value that a server thread could inherit.
_process_origin: Origin = SYSTEM


def surface_for_path(path: str) -> str:
    if path.startswith("/api/"):
        return Surface.API
    if path.startswith("/v1/"):
        return Surface.GATEWAY
    if path.startswith("/admin/"):
        return Surface.ADMIN
    return Surface.WEB


def current_origin() -> Origin:
    """The innermost origin: a task or command context, else the request, else the process."""
    origin = _origin.get()
    if origin is not None:
        return origin
    request = _request.get()
    if request is not None:
        return Origin(surface=surface_for_path(request.path_info), label="", request=request)
    return _process_origin


def enter_request(request: Any) -> Token[Any]:
    return _request.set(request)


def leave_request(token: Token[Any]) -> None:
    _request.reset(token)


def enter(origin: Origin) -> Token[Origin | None]:
    return _origin.set(origin)


def leave(token: Token[Origin | None]) -> None:
    _origin.reset(token)


@contextmanager
def audit_origin(*, surface: str, label: str) -> Iterator[None]:
    """Changes made inside are recorded as made by `label` through `surface`."""
    token = _origin.set(Origin(surface=surface, label=label))
    try:
        yield
    finally:
        _origin.reset(token)


def set_process_origin(*, surface: str, label: str) -> None:
    global _process_origin  # noqa: PLW0603 (one value per process, set once by manage.py)
    _process_origin = Origin(surface=surface, label=label)
