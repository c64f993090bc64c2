"""Who owns a key of the installation's object store, and whether a caller may name one.

The store (OBJECT_STORE_URL) holds every team's batch inputs and outputs, run artifacts,
checkpoints and exported model directories. A key that a caller names as an input (a batch
job's `input_uri`, a run's `model_uri`, `tokenizer_uri` or `dataset`) is read on behalf of the
team the work is for, so it must belong to that team:

- `teams/<team slug>/...` belongs to that team (what Switchyard writes for a team now goes
  there: batch inputs uploaded as text, for instance);
- a prefix whose owner is a row of an app above the registry (`runs/<id>/...`: the run's team;
  `inference/batch/jobs/<id>-<stamp>/...`: the job's workflow's team) belongs to that row's team; the
  app registers how to tell (`object_owner_register`, in its AppConfig.ready), as billing's
  subjects do (registry.auth.subjects), since the registry may not import it;
- anything else (keys written before teams owned keys, billing exports, a run or job that does
  not exist) is the platform's: only platform-wide roles name it.

`object_key_may_read` is asked before the store is touched, and a refusal reads the same whether
or not the key exists, so the answer tells nobody which keys another team has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from registry.models import Team

TEAMS_PREFIX = "teams"

# first segment of a key -> the owning team's id for the rest of the key (None: the platform's)
_OWNERS: dict[str, Callable[[str], int | None]] = {}


def object_owner_register(segment: str, owner: Callable[[str], int | None]) -> None:
    """Register who owns the keys under `segment/` (idempotent: the last wins). `owner` gets the
    rest of the key and answers the owning team's id, or None for the platform."""
    if segment == TEAMS_PREFIX or "/" in segment:
        raise ValueError(f"{segment!r} cannot be registered: keys under teams/ are owned by slug")
    _OWNERS[segment] = owner


def object_key_clean(key: object) -> str | None:
    """`key` if it is a plain relative key of the store, else None: no absolute path, no `.` or
    `..` or empty segment, no backslash, nothing unprintable, no URI (`file://`, `s3://`)."""
    if not isinstance(key, str) or not key or len(key) > 1024 or not key.isprintable():
        return None
    if key.startswith("/") or "\\" in key or "://" in key:
        return None
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        return None
    return key


def team_object_prefix(team: Team | None) -> str:
    """Where objects written for `team` go (`teams/<slug>/`); "" for the platform's."""
    return f"{TEAMS_PREFIX}/{team.slug}/" if team is not None else ""


def object_key_team(key: str) -> int | None:
    """The id of the team that owns `key` (a clean key), or None: the platform's."""
    head, _, rest = key.partition("/")
    if head == TEAMS_PREFIX:
        slug = rest.partition("/")[0]
        return Team.objects.filter(slug=slug).values_list("pk", flat=True).first()
    owner = _OWNERS.get(head)
    return owner(rest) if owner is not None else None


@dataclass(frozen=True)
class ObjectReach:
    """What keys a caller may name for work done for one team.

    `teams`: the teams in which the caller may do this work (None: platform-wide roles, every
    key); `team_id`: the team the work is for (None: the platform's). A team-scoped caller names
    only keys of that very team, and only if it holds the role there: the same rule as if the
    other teams did not exist (never a key of another team it also belongs to)."""

    teams: frozenset[int] | None
    team_id: int | None

    def may_read(self, key: str) -> bool:
        clean = object_key_clean(key)
        if clean is None:
            return False
        if self.teams is None:
            return True
        if self.team_id is None or self.team_id not in self.teams:
            return False
        return object_key_team(clean) == self.team_id


PLATFORM_REACH = ObjectReach(teams=None, team_id=None)
