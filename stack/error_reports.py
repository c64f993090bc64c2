"""Error pages and error reports that never show a connection string, token or key.

Django's own filter hides settings whose names contain KEY, TOKEN, SECRET, PASS and the like,
but not DATABASE_URL, REDIS_URL or CELERY_BROKER_URL, whose values carry passwords
(`postgres://app:<password>@db/...`), and it shows every local variable of every frame as it is.
Settings DEFAULT_EXCEPTION_REPORTER_FILTER and DEFAULT_EXCEPTION_REPORTER point here; they serve
the DEBUG page of development and the error e-mails of production alike.
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest
from django.template.defaultfilters import pprint
from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

SUBSTITUTE = SafeExceptionReporterFilter.cleansed_substitute

# Names (settings, request.META and so the process environment under runserver, dict keys)
# whose values are hidden whole: Django's list plus *_URL, DSNs and credentials.
HIDDEN_NAMES = re.compile(
    r"API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|CREDENTIAL|DSN|_URL$|^URL$", re.IGNORECASE
)
# Local variables hidden whole. Narrower than HIDDEN_NAMES ("author" and "passes" stay visible).
HIDDEN_VARIABLES = re.compile(r"password|passwd|secret|token|key|credential|dsn|_url$|^url$", re.IGNORECASE)

# scheme://userinfo@ in any text: the userinfo (user and password, or a bare token) is replaced.
_URL_USERINFO = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^\s/@?#'\"<>]+@", re.IGNORECASE)
# ?password=... or &X-Amz-Signature=... in a URL's query string.
_QUERY_SECRET = re.compile(
    r"([?&][^=&\s'\"<>]*(?:pass|secret|token|key|signature|credential)[^=&\s'\"<>]*=)[^&\s'\"<>#]+",
    re.IGNORECASE,
)


def redact_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by the substitute."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{SUBSTITUTE}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{SUBSTITUTE}", text)


class _Shown:
    """A frame variable whose printed form had to be redacted: shows the redacted text as is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class CredentialHidingFilter(SafeExceptionReporterFilter):
    hidden_settings = HIDDEN_NAMES

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        # Django's version recurses into dicts, lists and tuples through this method, so every
        # nested string is redacted too.
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):  # lazy strings too (they pass isinstance): str() them
            text = str(cleansed)
            redacted = redact_credentials(text)
            return cleansed if redacted == text else redacted
        return cleansed

    def get_traceback_frame_variables(self, request: HttpRequest | None, tb_frame: Any) -> Any:
        shown: list[tuple[str, Any]] = []
        for name, value in super().get_traceback_frame_variables(request, tb_frame):
            if isinstance(name, str) and HIDDEN_VARIABLES.search(name):
                shown.append((name, SUBSTITUTE))
                continue
            if isinstance(value, str | dict | list | tuple):
                value = self.cleanse_setting("", value)  # keys like "password" inside, too
            # Objects (and objects inside containers) print their own repr: redact that.
            printed = pprint(value)
            redacted = redact_credentials(printed)
            shown.append((name, value if redacted == printed else _Shown(redacted)))
        return shown


class CredentialHidingReporter(ExceptionReporter):
    """The last line of defence: exception messages and anything else on the page that holds a
    URL with credentials (`OperationalError: ... postgres://u:pw@...`) are redacted as rendered."""

    # The pages are rendered (and escaped) by Django; redaction only swaps text for asterisks.
    def get_traceback_html(self) -> SafeString:
        return mark_safe(redact_credentials(super().get_traceback_html()))  # noqa: S308

    def get_traceback_text(self) -> SafeString:
        return mark_safe(redact_credentials(super().get_traceback_text()))  # noqa: S308
