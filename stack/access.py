"""Who may read and who may write every endpoint: one table, keyed by URL name.

This is the declaration that `tests/stack/test_role_matrix.py` proves against the running URL
conf: for every URL it resolves (API and pages), each role (anonymous, no role, viewer,
operator, auditor, admin) is sent a GET and every write method (POST, PUT, PATCH, DELETE), and
the answer must be what this table says: allowed (never 401/403, never a 5xx) or refused (401
for an anonymous API call, a redirect to the login page for an anonymous page, 403 otherwise).
A URL that is not in this table fails that test, so a new endpoint cannot ship before someone
decides, here, who may use it. The views enforce it (`read_roles`/`write_roles` on API views,
registry.api.permissions.RolePermission; the same on pages, registry.views.RoleRequiredMixin);
this table is what they must agree with, and what SECURITY.md describes.

Admins may do everything an endpoint offers; a superuser is an admin (registry.auth.roles).
What a role sees inside an answer it may read (costs, workflows of a scoped token) is decided by
the views and selectors, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry.audit.roles import AUDIT_READERS
from registry.auth.roles import ADMINS, ALL_ROLES, LEDGER_READERS, OPERATORS, Role

# Anyone, logged in or not.
PUBLIC: frozenset[Role] | None = None
# No role writes (a read-only endpoint: writes are refused, 403 or 405).
NOBODY: frozenset[Role] = frozenset()


@dataclass(frozen=True)
class Access:
    read: frozenset[Role] | None
    write: frozenset[Role] | None

    def may_read(self, role: Role | None, *, authenticated: bool) -> bool:
        return _allows(self.read, role, authenticated=authenticated)

    def may_write(self, role: Role | None, *, authenticated: bool) -> bool:
        return _allows(self.write, role, authenticated=authenticated)


def _allows(roles: frozenset[Role] | None, role: Role | None, *, authenticated: bool) -> bool:
    if roles is None:  # PUBLIC
        return True
    if not authenticated or role is None:
        return False
    return role == Role.ADMIN or role in roles


def _rw(read: frozenset[Role] | None, write: frozenset[Role] | None) -> Access:
    return Access(read=read, write=write)


# Registry objects: every role reads them; operators change them; providers (they hold the
# credentials) only admins.
_REGISTRY = _rw(ALL_ROLES, OPERATORS)
_READ_ONLY = _rw(ALL_ROLES, NOBODY)
_OPERATOR_FORMS = _rw(OPERATORS, OPERATORS)  # pages that exist to change something
_LEDGER = _rw(LEDGER_READERS, NOBODY)  # ledger rows, prices, money: never viewers
_AUDIT = _rw(AUDIT_READERS, NOBODY)  # the audit trail: auditors and admins only, append-only

ACCESS: dict[str, Access] = {
    # --- Public: the login itself, health for load balancers (detail: admins, see /healthz),
    # and the charting library the pages load.
    "login": _rw(PUBLIC, PUBLIC),
    "logout": _rw(PUBLIC, PUBLIC),
    "healthz": _rw(PUBLIC, NOBODY),
    "plotly-js": _rw(PUBLIC, NOBODY),
    # The public keys that verify export manifests: public keys, for auditors without an account.
    "export-public-keys": _rw(PUBLIC, NOBODY),
    # --- Pages -----------------------------------------------------------------------------
    "overview": _READ_ONLY,
    "failovers": _READ_ONLY,  # failover events by kind and code (money only for cost readers)
    "tokens": _rw(ALL_ROLES, ALL_ROLES),  # everyone manages their own tokens
    "teams": _READ_ONLY,
    # Members are managed by platform admins and by the team's own admins (a team role; the
    # view checks it per team: stack.views.TeamDetailView).
    "team-page": _rw(ALL_ROLES, ADMINS),
    "workflows": _READ_ONLY,
    "workflows-new": _OPERATOR_FORMS,
    "workflow-page": _REGISTRY,  # switching the primary is a write
    "providers": _READ_ONLY,
    "providers-new": _rw(ADMINS, ADMINS),
    "providers-edit": _rw(ADMINS, ADMINS),
    "clusters": _READ_ONLY,
    "clusters-new": _OPERATOR_FORMS,
    "clusters-edit": _OPERATOR_FORMS,
    "models": _READ_ONLY,
    "models-new": _OPERATOR_FORMS,
    "models-edit": _OPERATOR_FORMS,
    "deployments": _READ_ONLY,
    "deployments-new": _OPERATOR_FORMS,
    "deployments-edit": _OPERATOR_FORMS,
    "jobs": _REGISTRY,  # dispatching a probe job is a write
    "job-detail": _READ_ONLY,
    "billing-dashboard": _LEDGER,
    "billing-ledger": _LEDGER,
    "audit-trail": _AUDIT,
    "audit-export": _AUDIT,
    "billing-budgets": _LEDGER,
    "billing-budget-new": _OPERATOR_FORMS,
    "billing-budget-edit": _OPERATOR_FORMS,
    "billing-budget-alert-ack": _OPERATOR_FORMS,
    "billing-alert-channels": _LEDGER,
    "billing-alert-channel-new": _OPERATOR_FORMS,  # a webhook URL is a trust boundary
    "billing-alert-channel-edit": _OPERATOR_FORMS,
    "billing-anomalies": _LEDGER,
    "billing-anomaly": _LEDGER,
    "billing-prices": _rw(LEDGER_READERS, ADMINS),
    "billing-reconciliation": _rw(LEDGER_READERS, LEDGER_READERS),  # importing an invoice
    "billing-reconciliation-detail": _LEDGER,
    "billing-export": _rw(LEDGER_READERS, LEDGER_READERS),  # starting an export
    "billing-export-job": _LEDGER,
    "billing-export-file": _LEDGER,
    "training-runs": _READ_ONLY,
    "training-run-new": _OPERATOR_FORMS,
    "training-run": _READ_ONLY,
    "training-run-metrics": _READ_ONLY,
    "training-run-cancel": _REGISTRY,
    "inference-home": _READ_ONLY,
    "inference-workflow": _REGISTRY,  # chaos and primary switches from the page
    "inference-provider": _READ_ONLY,
    # Recommendations: every role reads them (a viewer without the money), operators of the
    # workflow's team accept or dismiss them (the view checks the team).
    "decisions:recommendations": _READ_ONLY,
    "decisions:recommendation": _REGISTRY,
    # --- API ----------------------------------------------------------------------------------
    "api-root": _READ_ONLY,
    "schema": _READ_ONLY,
    "provider-list": _rw(ALL_ROLES, ADMINS),
    "provider-detail": _rw(ALL_ROLES, ADMINS),
    "cluster-list": _REGISTRY,
    "cluster-detail": _REGISTRY,
    "cluster-drain": _REGISTRY,
    "cluster-resume": _REGISTRY,
    "cluster-interruption": _REGISTRY,  # a spot interruption notice: operators and admins
    "registeredmodel-list": _REGISTRY,
    "registeredmodel-detail": _REGISTRY,
    "deployment-list": _REGISTRY,
    "deployment-detail": _REGISTRY,
    "workflow-list": _REGISTRY,
    "workflow-detail": _REGISTRY,
    "workflow-policy": _REGISTRY,
    "workflow-switch": _REGISTRY,
    "workflow-versions": _READ_ONLY,
    "failoverevent-list": _READ_ONLY,
    "failoverevent-detail": _READ_ONLY,
    "usage-export": _LEDGER,
    "usagerecord-list": _LEDGER,
    "auditentry-list": _AUDIT,
    "auditentry-detail": _AUDIT,
    "auditentry-export": _AUDIT,
    "usagerecord-detail": _LEDGER,
    "pricebook-list": _rw(LEDGER_READERS, ADMINS),
    "pricebook-import-file": _rw(LEDGER_READERS, ADMINS),
    "pricebook-detail": _rw(LEDGER_READERS, ADMINS),
    "budget-list": _rw(LEDGER_READERS, OPERATORS),
    "budget-detail": _rw(LEDGER_READERS, OPERATORS),
    "budgetalert-list": _LEDGER,
    "budgetalert-detail": _LEDGER,
    "budgetalert-acknowledge": _rw(LEDGER_READERS, OPERATORS),
    "exportjob-list": _rw(LEDGER_READERS, LEDGER_READERS),
    "exportjob-detail": _LEDGER,
    "exportjob-file": _LEDGER,
    "invoiceimport-list": _rw(LEDGER_READERS, LEDGER_READERS),
    "invoiceimport-detail": _LEDGER,
    "invoiceimport-rows": _LEDGER,
    "probejob-list": _REGISTRY,
    "probejob-detail": _READ_ONLY,
    "trainingrun-list": _REGISTRY,
    "trainingrun-detail": _READ_ONLY,
    "trainingrun-cancel": _REGISTRY,
    "trainingrun-metrics": _READ_ONLY,
    # A run's build-or-buy report: every figure in it is money (no viewers).
    "build-or-buy": _LEDGER,
    "chaos-list": _READ_ONLY,
    "chaos-detail": _REGISTRY,
    "eval-set-list": _REGISTRY,
    "eval-set-detail": _READ_ONLY,
    "eval-set-cases": _REGISTRY,
    "eval-run-list": _REGISTRY,
    "eval-run-detail": _READ_ONLY,
    "feedback-list": _REGISTRY,
    "batch-job-list": _REGISTRY,
    "batch-job-detail": _READ_ONLY,
    "batch-job-cancel": _REGISTRY,
    "recommendation-list": _READ_ONLY,
    "recommendation-detail": _READ_ONLY,
    "recommendation-accept": _REGISTRY,
    "recommendation-dismiss": _REGISTRY,
    # Replay studies (decisions): every role reads; operators start them (batch jobs).
    "replay-study-list": _REGISTRY,
    "replay-study-detail": _READ_ONLY,
    "replay-study-results": _READ_ONLY,
    "decisions:replay-studies": _READ_ONLY,
    "decisions:replay-study-page": _READ_ONLY,
    # Teams: every role reads the teams it is in (a platform-wide role: all) and their members;
    # of the global roles only admins change them. A team's own admins also change its name,
    # limits and members (a team role, proved by tests/stack/test_teams_api.py).
    "team-list": _rw(ALL_ROLES, ADMINS),
    "team-detail": _rw(ALL_ROLES, ADMINS),
    "team-members": _rw(ALL_ROLES, ADMINS),
    "team-member": _rw(ALL_ROLES, ADMINS),
}

# URL prefixes with an access model of their own, proved by their own tests rather than by
# the table above: the Django admin (staff users only, Django's permissions) and the
# OpenAI-compatible gateway (bearer tokens only, each limited to the workflows it may call).
SEPARATELY_GUARDED: dict[str, str] = {
    "admin/": "Django admin: staff users with Django model permissions",
    "v1/": "OpenAI-compatible gateway: bearer tokens, workflow scope (tests/inference/test_gateway*.py)",
    "metrics": "Prometheus scrapes: SWITCHYARD_METRICS_TOKEN and/or SWITCHYARD_METRICS_ALLOW_NETWORKS (tests/stack/test_metrics.py)",
}
