"""Which operations each test fuzzes: the shards, and for a role other than the admin the
operations the one access table (stack.access) lets it call."""

from __future__ import annotations

import re

from django.urls import resolve
from drf_spectacular.generators import SchemaGenerator

from registry.auth.roles import Role
from stack.access import ACCESS

ADMIN_FIRST_HALF = r"^/api/[a-e]"
SHARDS = {
    "viewer": (Role.VIEWER, []),
    "operator": (Role.OPERATOR, []),
    "auditor": (Role.AUDITOR, []),
    "admin-a-e": (Role.ADMIN, ["--include-path-regex", ADMIN_FIRST_HALF]),
    "admin-rest": (Role.ADMIN, ["--exclude-path-regex", ADMIN_FIRST_HALF]),
}
WRITES = ("post", "put", "patch", "delete")


def operations_for(role: Role) -> tuple[list[str], int]:
    """(the operationIds the role may call, the schema's number of operations), by stack.access.

    An operation the table refuses to a role answers 403 whatever its inputs (from the
    permission check, or for a team's writes from the team-admin check after the team is
    looked up): fuzzing them under that role sent thousands of requests that could only be
    refused. The role matrix (tests/stack/test_role_matrix.py) proves every such refusal and
    checks its body against the documented ErrorDetail; the admin's run fuzzes every
    operation's inputs; each other role fuzzes the operations it may call, where what it is
    allowed to see and change can differ from the admin's."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    allowed: list[str] = []
    total = 0
    for path, item in schema["paths"].items():
        # The URL name, from the path with every parameter filled in (each converter takes "1").
        access = ACCESS[resolve(re.sub(r"\{[^}]+\}", "1", path)).url_name]
        for method, operation in item.items():
            if method != "get" and method not in WRITES:
                continue
            total += 1
            may = access.may_write if method in WRITES else access.may_read
            if may(role, authenticated=True):
                allowed.append(operation["operationId"])
    return allowed, total


def shard_filters(role: Role, paths: list[str]) -> tuple[list[str], int | None]:
    """The shard's operation filters for schemathesis, and how many operations they select
    (None where the path split of the admin's run decides)."""
    if role == Role.ADMIN:
        return paths, None
    allowed, _ = operations_for(role)
    return [arg for op in allowed for arg in ("--include-operation-id", op)], len(allowed)
