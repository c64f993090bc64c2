"""Who may read the audit trail: auditors and admins (an admin holds every role)."""

from __future__ import annotations

from registry.auth.roles import Role

AUDIT_READERS = frozenset({Role.AUDITOR, Role.ADMIN})
