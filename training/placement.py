"""Where a run's learners go: a pure function of the clusters, their prices and the constraints.

No database access here: training.services gathers `ClusterOption`s (status from heartbeats,
the accelerator-hour price in force, free capacity = Cluster.capacity minus learners already
placed there by live runs) and records the outcome as PlacementDecision rows.

Rules, in order:
1. A cluster is a candidate when it is healthy (not degraded, down or draining), no hard budget
   over it is spent this period (the cluster's, its provider's, the run's team's or the run's:
   `budget_refusal` says which), matches the accelerator type and regions asked for, has an
   accelerator-hour price in force and a free learner slot of at least learners.ranks
   accelerators. Every other cluster is listed with the reason it was rejected.
2. Pinned learners go to their pinned cluster, if it is a candidate.
3. The others go cheapest first (price, then slug for a stable order), filling a cluster's free
   slots before moving on, except that when more than one candidate has room, the learners are
   spread over at least two clusters: losing one cluster then costs a fraction of the run, not
   all of it (the reason to train across clusters at all).
4. A learner that already has a checkpoint (re-placement) weighs moving it: a cluster whose store
   is not the one holding the checkpoint pays its egress once (GB × the holding cluster's
   egress price), against `horizon_hours` of each cluster's accelerator-hour price. "Cheapest"
   is then price × horizon + that move; both figures are recorded for every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

BYTES_PER_GB = Decimal(10**9)  # as billing.resource_bills.egress_bill bills it


@dataclass(frozen=True)
class ClusterOption:
    cluster_id: int
    slug: str
    status: str  # stack Cluster.Status value
    accelerator_type: str
    region: str
    free: int  # learner slots not taken by live runs
    price: Decimal | None  # accelerator-hour price in force, None when there is none
    price_book_id: int | None = None
    currency: str = "USD"
    budget_refusal: str = ""  # why a hard budget forbids spending here ("" when none does)
    devices: int = 1  # accelerators a learner slot holds (accelerator_count // capacity)
    store: str = ""  # which store its learners keep checkpoints in ('' = the installation's)


@dataclass(frozen=True)
class CheckpointAt:
    """Where a re-placed learner's newest checkpoint lies and what moving it out costs."""

    store: str  # the store holding it (ClusterOption.store's terms)
    nbytes: int
    egress_price: Decimal | None  # per GB, of the cluster whose store holds it (None: not billed)
    cluster: str = ""  # that cluster's slug ('' for the installation's store)

    def move(self, option: ClusterOption) -> tuple[Decimal, Decimal]:
        """(GB that would cross, their egress cost) to resume the learner on `option`."""
        if option.store == self.store:
            return Decimal(0), Decimal(0)
        gb = Decimal(self.nbytes) / BYTES_PER_GB
        return gb, gb * (self.egress_price or Decimal(0))


@dataclass(frozen=True)
class Constraints:
    accelerator_type: str = ""
    regions: tuple[str, ...] = ()
    pins: dict[int, str] = field(default_factory=dict)  # learner index -> cluster slug
    ranks: int = 1  # devices each learner runs on (learners.ranks)


@dataclass(frozen=True)
class Assignment:
    learner_index: int
    option: ClusterOption
    pinned: bool


@dataclass(frozen=True)
class PlacementResult:
    assignments: list[Assignment]
    candidates: list[dict[str, object]]  # every cluster considered, as recorded
    unplaced: list[int]  # learner indexes with no slot
    problems: list[str]  # why learners are unplaced (readable)

    @property
    def complete(self) -> bool:
        return not self.unplaced


def _rejection(option: ClusterOption, constraints: Constraints) -> str:
    if option.status != "healthy":
        return f"status {option.status}"
    if option.budget_refusal:
        return option.budget_refusal
    if (
        constraints.accelerator_type
        and option.accelerator_type.lower() != constraints.accelerator_type.lower()
    ):
        return f"accelerator {option.accelerator_type}, not {constraints.accelerator_type}"
    if constraints.regions and option.region not in constraints.regions:
        return f"region {option.region or '(none)'} not in {', '.join(constraints.regions)}"
    if option.price is None:
        return "no accelerator-hour price in force"
    if option.free <= 0:
        return "no free capacity"
    if option.devices < constraints.ranks:
        return f"{option.devices} accelerator(s) per learner slot, fewer than learners.ranks ({constraints.ranks})"
    return ""


def place(
    *,
    learners: list[int],
    options: list[ClusterOption],
    constraints: Constraints,
    avoid: frozenset[int] = frozenset(),
    checkpoint: CheckpointAt | None = None,
    horizon_hours: Decimal = Decimal(1),
) -> PlacementResult:
    """Assign each learner index to a cluster (see the module docstring for the rules).

    `avoid` holds cluster ids to use only when nothing else fits (a failover prefers a cluster
    other than the one its learner was just lost on, even while heartbeats still call it healthy).
    `checkpoint` is where the (one) re-placed learner's state lies: rule 4 weighs moving it.
    """
    rejected = {o.cluster_id: _rejection(o, constraints) for o in options}
    candidates = [o for o in options if not rejected[o.cluster_id]]

    def cost(o: ClusterOption) -> Decimal:
        """What choosing `o` costs for the horizon: its hours, plus moving the checkpoint there."""
        hours = (o.price or Decimal(0)) * horizon_hours
        return hours + (checkpoint.move(o)[1] if checkpoint is not None else Decimal(0))

    def row(o: ClusterOption) -> dict[str, object]:
        found: dict[str, object] = {
            "cluster": o.slug,
            "cluster_id": o.cluster_id,
            "status": o.status,
            "price": str(o.price) if o.price is not None else None,
            "currency": o.currency,
            "free": o.free,
            "rejected": rejected[o.cluster_id],
        }
        if checkpoint is not None:
            gb, egress = checkpoint.move(o)
            found.update(
                checkpoint_gb=str(gb),
                egress_cost=str(egress),
                horizon_hours=str(horizon_hours),
                horizon_cost=str((o.price or Decimal(0)) * horizon_hours),
            )
        return found

    record = [row(o) for o in sorted(options, key=lambda o: (o.price is None, cost(o), o.slug))]
    free = {o.cluster_id: o.free for o in candidates}
    by_slug = {o.slug: o for o in options}
    assignments: list[Assignment] = []
    problems: list[str] = []
    unplaced: list[int] = []
    rest: list[int] = []
    for index in learners:
        slug = constraints.pins.get(index)
        if slug is None:
            rest.append(index)
            continue
        option = by_slug.get(slug)
        if option is None:
            problems.append(f"learner {index} is pinned to {slug}, which does not exist")
            unplaced.append(index)
        elif rejected[option.cluster_id]:
            problems.append(f"learner {index} is pinned to {slug}: {rejected[option.cluster_id]}")
            unplaced.append(index)
        elif free[option.cluster_id] <= 0:
            problems.append(f"learner {index} is pinned to {slug}: no free capacity left")
            unplaced.append(index)
        else:
            free[option.cluster_id] -= 1
            assignments.append(Assignment(index, option, pinned=True))

    def order(o: ClusterOption) -> tuple[bool, Decimal, Decimal, str]:
        return (o.cluster_id in avoid, cost(o), o.price or Decimal(0), o.slug)

    ranked = sorted(candidates, key=order)
    used = {a.option.cluster_id for a in assignments}
    for i, index in enumerate(rest):
        with_room = [o for o in ranked if free[o.cluster_id] > 0]
        if not with_room:
            unplaced.append(index)
            continue
        choice = with_room[0]
        # Spread: the last learner left, with everything so far on one cluster, takes the
        # cheapest other cluster with room, if there is one.
        if i == len(rest) - 1 and len(learners) > 1 and used == {choice.cluster_id}:
            others = [o for o in with_room if o.cluster_id not in used]
            if others:
                choice = others[0]
        free[choice.cluster_id] -= 1
        used.add(choice.cluster_id)
        assignments.append(Assignment(index, choice, pinned=False))
    left = [i for i in unplaced if i not in constraints.pins]
    if left:
        why = "; ".join(f"{r['cluster']}: {r['rejected']}" for r in record if r["rejected"]) or "all full"
        problems.append(f"no cluster can take learner(s) {', '.join(map(str, left))} ({why})")
    assignments.sort(key=lambda a: a.learner_index)
    return PlacementResult(
        assignments=assignments, candidates=record, unplaced=sorted(unplaced), problems=problems
    )
