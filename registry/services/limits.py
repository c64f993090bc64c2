"""Rate limits a workflow, team or key may set: whole requests and tokens a minute, within the column."""

from __future__ import annotations

from registry.services.errors import RegistryError

RATE_LIMIT_MAX = 2_147_483_647  # the PositiveIntegerField columns of rpm_limit and tpm_limit


def rate_limit_check(*, rpm_limit: int | None, tpm_limit: int | None) -> None:
    for field, value in (("rpm_limit", rpm_limit), ("tpm_limit", tpm_limit)):
        if value is not None and not 0 <= value <= RATE_LIMIT_MAX:
            raise RegistryError(f"a rate limit is a whole number from 0 to {RATE_LIMIT_MAX}", field=field)
