"""Login throttling: the hooks django-axes calls (settings AXES_CLIENT_IP_CALLABLE and
AXES_LOCKOUT_CALLABLE).

Axes counts failed logins per username and client address and refuses further attempts from
that pair for SWITCHYARD_LOGIN_COOLOFF_SECONDS once SWITCHYARD_LOGIN_FAILURE_LIMIT is reached
(see the settings). Only `django.contrib.auth.authenticate()` is watched: the login page and the
admin's; SSO callbacks name no username and are not counted (not_a_password_attempt). API
bearer tokens never pass through it, so a locked-out login leaves tokens working.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def client_ip(request: HttpRequest) -> str:
    """The address a login attempt came from.

    REMOTE_ADDR, unless SWITCHYARD_TRUSTED_PROXIES says that N reverse proxies stand in front of
    the web app: each appends the address it saw to X-Forwarded-For, so the N-th entry from the
    right is the one our outermost proxy saw. Entries further left were written by the client and
    are not trusted (a client could otherwise pick a fresh address for every attempt).
    """
    remote = str(request.META.get("REMOTE_ADDR", ""))
    proxies: int = settings.SWITCHYARD_TRUSTED_PROXIES
    if proxies <= 0:
        return remote
    hops = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    hops = [hop for hop in hops if hop]
    if len(hops) < proxies:
        return remote  # not through the configured proxies; the direct peer is all we know
    return hops[-proxies]


def not_a_password_attempt(request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
    """Whether axes should leave this attempt alone: one that names no username guesses no
    password here. That is the SSO callback (registry.auth.sso), whose password is checked by
    the identity provider: counted, its failures would be (no username, address) pairs, and a
    few broken callbacks would lock every SSO user behind that address out."""
    return not (credentials or {}).get("username")


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """The login page again, with the lockout said plainly, as 429 Too Many Requests."""
    minutes = max(1, math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60))
    return render(
        request,
        "registration/login.html",
        {
            "form": AuthenticationForm(request),
            "next": request.POST.get("next", request.GET.get("next", "")),
            "locked_out": True,
            "cooloff_minutes": minutes,
        },
        status=429,
    )
