"""The audit trail: who changed which registry object, price, budget, key, membership or chaos
setting, when, from which surface, with the values before and after (secrets: only that they
changed). django-auditlog computes the diffs; this app holds the append-only rows, the origin of
each change, the auditors' API, page and CSV export."""
