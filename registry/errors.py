"""The one base class of the errors that a business rule raises.

Every app's refusals (a registry change, a dispatch, a missing price, a spent budget, a bad
run config) subclass `DomainError`, so the API error handler (stack.api_errors) maps them to
responses without importing any app, and pages show the same message as a form error.
"""

from __future__ import annotations


class DomainError(Exception):
    """A refused action; the message is written for the person who asked.

    `field` names the input the message is about (None: the request as a whole);
    `status_code` is what the API answers (400 unless a subclass says otherwise)."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def field_errors(self) -> dict[str, list[str]]:
        """Messages per field, as DRF's validation errors shape them."""
        return {self.field or "non_field_errors": [str(self)]}

    def api_body(self) -> dict[str, object]:
        """The JSON body of the API's error response."""
        return dict(self.field_errors())


class MultiFieldError(DomainError):
    """A refusal with messages for several fields at once (`errors`: field -> messages)."""

    def __init__(self, errors: dict[str, list[str]], *, message: str | None = None) -> None:
        self.errors = {name: list(msgs) for name, msgs in errors.items()}
        super().__init__(message or "; ".join(f"{k}: {' '.join(v)}" for k, v in self.errors.items()))

    def field_errors(self) -> dict[str, list[str]]:
        return self.errors
