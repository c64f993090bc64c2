"""Placement: cheapest first, spread over two clusters, pins, capacity, health, no candidate."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from training.placement import CheckpointAt, ClusterOption, Constraints, place


def _opt(
    cid: int,
    price: str | None,
    *,
    free: int = 2,
    status: str = "healthy",
    acc: str = "A10G",
    region: str = "r1",
) -> ClusterOption:
    return ClusterOption(
        cluster_id=cid,
        slug=f"c{cid}",
        status=status,
        accelerator_type=acc,
        region=region,
        free=free,
        price=Decimal(price) if price is not None else None,
        price_book_id=cid * 10 if price is not None else None,
    )


def _where(result: object) -> dict[int, str]:
    return {a.learner_index: a.option.slug for a in result.assignments}  # type: ignore[attr-defined]


def test_learners_go_cheapest_first_but_spread_over_two_clusters() -> None:
    result = place(
        learners=[0, 1, 2],
        options=[_opt(1, "3.0", free=4), _opt(2, "1.0", free=4)],
        constraints=Constraints(),
    )
    assert _where(result) == {0: "c2", 1: "c2", 2: "c1"}
    assert result.complete


def test_a_single_learner_takes_the_cheapest_cluster() -> None:
    result = place(learners=[0], options=[_opt(1, "3.0"), _opt(2, "1.0")], constraints=Constraints())
    assert _where(result) == {0: "c2"}


def test_one_fitting_cluster_takes_every_learner_it_has_room_for() -> None:
    result = place(
        learners=[0, 1], options=[_opt(1, "1.0"), _opt(2, "0.5", status="down")], constraints=Constraints()
    )
    assert _where(result) == {0: "c1", 1: "c1"}


def test_capacity_limits_each_cluster() -> None:
    result = place(
        learners=[0, 1, 2],
        options=[_opt(1, "1.0", free=1), _opt(2, "2.0", free=1)],
        constraints=Constraints(),
    )
    assert _where(result) == {0: "c1", 1: "c2"}
    assert result.unplaced == [2]
    assert "no cluster can take learner(s) 2" in result.problems[0]


def test_unhealthy_draining_unpriced_and_mismatched_clusters_are_rejected_with_reasons() -> None:
    options = [
        _opt(1, "0.1", status="down"),
        _opt(2, "0.2", status="draining"),
        _opt(3, None),
        _opt(4, "0.3", acc="H100"),
        _opt(5, "0.4", region="r9"),
        _opt(6, "0.5", free=0),
        _opt(7, "9.0"),
    ]
    result = place(
        learners=[0], options=options, constraints=Constraints(accelerator_type="a10g", regions=("r1",))
    )
    assert _where(result) == {0: "c7"}
    why = {c["cluster"]: c["rejected"] for c in result.candidates}
    assert why == {
        "c1": "status down",
        "c2": "status draining",
        "c3": "no accelerator-hour price in force",
        "c4": "accelerator H100, not a10g",
        "c5": "region r9 not in r1",
        "c6": "no free capacity",
        "c7": "",
    }


def test_no_candidate_names_every_rejected_cluster() -> None:
    result = place(
        learners=[0, 1], options=[_opt(1, "1.0", status="down"), _opt(2, None)], constraints=Constraints()
    )
    assert not result.assignments
    assert result.unplaced == [0, 1]
    assert result.problems == [
        "no cluster can take learner(s) 0, 1 (c1: status down; c2: no accelerator-hour price in force)"
    ]


def test_pins_override_price() -> None:
    result = place(
        learners=[0, 1],
        options=[_opt(1, "1.0"), _opt(2, "5.0")],
        constraints=Constraints(pins={0: "c2", 1: "c2"}),
    )
    assert _where(result) == {0: "c2", 1: "c2"}
    assert all(a.pinned for a in result.assignments)


def test_a_pin_to_an_unhealthy_cluster_leaves_that_learner_unplaced() -> None:
    result = place(
        learners=[0, 1],
        options=[_opt(1, "1.0"), _opt(2, "5.0", status="down")],
        constraints=Constraints(pins={1: "c2"}),
    )
    assert _where(result) == {0: "c1"}
    assert result.problems == ["learner 1 is pinned to c2: status down"]


def test_a_failover_avoids_the_cluster_it_was_lost_on_when_another_fits() -> None:
    options = [_opt(1, "1.0"), _opt(2, "2.0")]
    assert _where(place(learners=[0], options=options, constraints=Constraints(), avoid=frozenset({1}))) == {
        0: "c2"
    }
    only = [_opt(1, "1.0")]
    assert _where(place(learners=[0], options=only, constraints=Constraints(), avoid=frozenset({1}))) == {
        0: "c1"
    }


def test_a_learner_of_n_ranks_goes_only_where_a_slot_holds_n_accelerators() -> None:
    small = ClusterOption(**{**_opt(1, "1.0").__dict__, "devices": 1})
    big = ClusterOption(**{**_opt(2, "3.0").__dict__, "devices": 4})
    result = place(learners=[0, 1], options=[small, big], constraints=Constraints(ranks=2))
    assert _where(result) == {0: "c2", 1: "c2"}  # the cheaper cluster's slots are too small
    assert (
        result.candidates[0]["rejected"] == "1 accelerator(s) per learner slot, fewer than learners.ranks (2)"
    )


def _stored(cid: int, price: str, store: str) -> ClusterOption:
    return dataclasses.replace(_opt(cid, price), store=store)


def test_re_placement_weighs_moving_the_checkpoint_against_the_horizon_of_compute() -> None:
    # The learner's 30 GB checkpoint is in store "a" (cluster c1's, which bills 0.09/GB out).
    # c2 is 0.50/h cheaper but keeps its checkpoints elsewhere: over one hour moving costs more
    # (2.70) than it saves, over ten hours it pays for itself (5.00 saved).
    options = [_stored(1, "2.00", "a"), _stored(2, "1.50", "b"), _stored(3, "2.00", "a")]
    checkpoint = CheckpointAt(store="a", nbytes=30 * 10**9, egress_price=Decimal("0.09"), cluster="c1")
    short = place(
        learners=[0],
        options=options,
        constraints=Constraints(),
        avoid=frozenset({1}),
        checkpoint=checkpoint,
        horizon_hours=Decimal(1),
    )
    assert _where(short) == {0: "c3"}
    rows = {r["cluster"]: r for r in short.candidates}
    assert rows["c2"]["checkpoint_gb"] == "30" and Decimal(str(rows["c2"]["egress_cost"])) == Decimal("2.70")
    assert Decimal(str(rows["c3"]["egress_cost"])) == 0 and rows["c3"]["horizon_cost"] == "2.00"
    long = place(
        learners=[0],
        options=options,
        constraints=Constraints(),
        avoid=frozenset({1}),
        checkpoint=checkpoint,
        horizon_hours=Decimal(10),
    )
    assert _where(long) == {0: "c2"}


def test_a_checkpoint_in_the_installations_store_moves_for_free_but_its_size_is_recorded() -> None:
    checkpoint = CheckpointAt(store="", nbytes=2 * 10**9, egress_price=None)
    result = place(
        learners=[0],
        options=[_stored(1, "2.00", ""), _stored(2, "1.00", "b")],
        constraints=Constraints(),
        checkpoint=checkpoint,
    )
    assert _where(result) == {0: "c2"}  # cheapest: nothing is billed for leaving that store
    rows = {r["cluster"]: r for r in result.candidates}
    assert rows["c2"]["checkpoint_gb"] == "2" and Decimal(str(rows["c2"]["egress_cost"])) == 0
