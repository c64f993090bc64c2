"""Run configs: every problem comes back as a field message; valid configs are normalised."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import make_cluster
from training.run_config import DATASET_REFUSED, RunConfig, RunConfigError, demo_config, run_config_validate


def _errors(raw: Any) -> dict[str, list[str]]:
    with pytest.raises(RunConfigError) as info:
        run_config_validate(raw)
    return info.value.errors


def test_a_minimal_config_gets_every_default_and_a_schedule_length() -> None:
    cfg = run_config_validate({"stop": {"outer_steps": 10}})
    assert cfg["learners"] == {"count": 2, "quorum": 2, "batch_size": 16, "ranks": 1, "sharding": "ddp"}
    assert cfg["inner"]["total_steps"] == 10 * cfg["h"]
    assert "object_store_url" not in cfg  # every run uses the installation's store
    rc = RunConfig(cfg)
    assert rc.syncer_config().quorum == 2
    assert rc.model_config().n_layer == cfg["model"]["n_layer"]
    assert rc.data_config().source == "stdlib"


def test_quorum_outside_one_to_m_is_a_field_error() -> None:
    errors = _errors({"learners": {"count": 2, "quorum": 3}, "stop": {"outer_steps": 5}})
    assert errors == {"learners.quorum": ["must be between 1 and learners.count (2)"]}


def test_unknown_keys_and_bad_values_are_all_reported_at_once() -> None:
    errors = _errors(
        {
            "learnerz": 3,
            "model": {"n_embd": 30, "n_head": 4, "depth": 2},
            "compression": {"kind": "2bit"},
            "stop": {"outer_steps": 5, "token_budget": 1000},
            "money_budget": 12.5,
            "dataset": "ftp://nowhere",
        }
    )
    assert errors["learnerz"] == ["unknown field"]
    assert errors["model.depth"] == ["unknown field"]
    assert "must be one of" in errors["compression.kind"][0]
    assert errors["stop"] == ["give exactly one of outer_steps or token_budget"]
    assert "decimal string" in errors["money_budget"][0]
    assert errors["dataset"] == [DATASET_REFUSED]


def test_the_stop_condition_is_required() -> None:
    assert "stop" in _errors({})


def test_money_budget_is_kept_as_an_exact_decimal_string() -> None:
    cfg = run_config_validate({"stop": {"token_budget": 100000}, "money_budget": "12.50"})
    assert cfg["money_budget"] == "12.50"
    assert str(RunConfig(cfg).money_budget) == "12.50"
    assert _errors({"stop": {"token_budget": 10}, "money_budget": "-1"}) == {
        "money_budget": ["must be more than 0"]
    }


def test_chunks_must_be_much_shorter_than_the_learner_timeout() -> None:
    errors = _errors({"stop": {"outer_steps": 1}, "chunk_seconds": 30, "learner_timeout": 40})
    assert errors == {"learner_timeout": ["must be more than twice chunk_seconds"]}


def test_fragments_cannot_outnumber_blocks() -> None:
    errors = _errors({"stop": {"outer_steps": 1}, "model": {"n_layer": 1}, "fragments": {"count": 2}})
    assert errors == {"fragments.count": ["must be at most model.n_layer (1)"]}


@pytest.mark.django_db
def test_pins_name_existing_clusters_and_learners() -> None:
    cluster = make_cluster()
    cfg = run_config_validate({"stop": {"outer_steps": 1}, "placement": {"pins": {1: cluster.slug}}})
    assert cfg["placement"]["pins"] == {"1": cluster.slug}
    errors = _errors({"stop": {"outer_steps": 1}, "placement": {"pins": {"5": cluster.slug, "0": "nope"}}})
    assert errors["placement.pins"] == ["learner 5 does not exist (0..1)", "learner 0: no cluster 'nope'"]


def test_the_demo_config_is_valid() -> None:
    cfg = run_config_validate(demo_config())
    assert cfg["learners"]["count"] == 2


def test_down_compression_radial_averaging_and_adaptive_grace_reach_the_engine() -> None:
    cfg = run_config_validate(
        {
            "compression": {"kind": "4bit", "down": "int8"},
            "syncer": {"radial_directional": True, "adaptive_grace": True, "grace_seconds": 3.0},
            "stop": {"outer_steps": 5},
        }
    )
    rc = RunConfig(cfg)
    assert rc.compression_config().kind == "4bit" and rc.compression_config().down_kind == "int8"
    syncer = rc.syncer_config()
    assert syncer.radial_directional and syncer.adaptive_grace and syncer.grace == 3.0
    # By default the way down is compressed like the way up, and both options are off.
    plain = RunConfig(run_config_validate({"compression": {"kind": "4bit"}, "stop": {"outer_steps": 5}}))
    assert plain.compression_config().down_kind == "4bit"
    assert not plain.syncer_config().radial_directional and not plain.syncer_config().adaptive_grace
    # A config stored before `down` existed keeps full versions coming down.
    old = dict(plain.raw, compression={"kind": "4bit", "error_feedback": False})
    assert RunConfig(old).compression_config().down_kind == "fp32"


def test_fp4_both_ways_with_learner_error_feedback_reaches_the_engine() -> None:
    cfg = run_config_validate(
        {"compression": {"kind": "fp4_e3m0", "error_feedback": True}, "stop": {"outer_steps": 5}}
    )
    comp = RunConfig(cfg).compression_config()
    assert (comp.kind, comp.down_kind, comp.error_feedback) == ("fp4_e3m0", "fp4_e3m0", True)
    # Learner-side error feedback stays off unless asked for; int4 keeps its name.
    plain = RunConfig(run_config_validate({"compression": {"kind": "4bit"}, "stop": {"outer_steps": 5}}))
    assert plain.compression_config().error_feedback is False
    assert plain.compression_config().kind == "4bit"


def test_bad_down_compression_and_non_boolean_switches_are_field_errors() -> None:
    errors = _errors(
        {
            "compression": {"down": "2bit"},
            "syncer": {"radial_directional": "yes", "adaptive_grace": 1},
            "stop": {"outer_steps": 5},
        }
    )
    assert errors == {
        "compression.down": ["must be null (as compression.kind) or one of fp32, bf16, int8, 4bit, fp4_e3m0"],
        "syncer.radial_directional": ["must be true or false"],
        "syncer.adaptive_grace": ["must be true or false"],
    }


@pytest.mark.django_db
def test_ranks_per_learner_must_divide_its_batch_and_fit_a_pinned_clusters_slots() -> None:
    cfg = run_config_validate({"stop": {"outer_steps": 1}, "learners": {"batch_size": 8, "ranks": 2}})
    assert RunConfig(cfg).ranks == 2 and RunConfig(cfg).batch_size == 8
    assert RunConfig({"learners": {"count": 1}}).ranks == 1  # a config stored before ranks existed
    errors = _errors({"stop": {"outer_steps": 1}, "learners": {"batch_size": 16, "ranks": 3}})
    assert errors == {
        "learners.ranks": ["must divide learners.batch_size (16): each rank draws batch_size / ranks"]
    }
    assert _errors({"stop": {"outer_steps": 1}, "learners": {"ranks": 0}}) == {
        "learners.ranks": ["must be at least 1"]
    }
    assert _errors({"stop": {"outer_steps": 1}, "learners": {"ranks": 65}}) == {
        "learners.ranks": ["must be at most 64"]
    }
    small = make_cluster(accelerator_count=2, capacity=2)  # one accelerator per learner slot
    errors = _errors(
        {"stop": {"outer_steps": 1}, "learners": {"ranks": 2}, "placement": {"pins": {"0": small.slug}}}
    )
    assert errors == {
        "learners.ranks": [f"learner 0 is pinned to {small.slug}, whose learner slots hold 1 accelerator(s)"]
    }


@pytest.mark.django_db
def test_a_learner_is_sharded_with_fsdp_only_over_two_ranks_or_more() -> None:
    cfg = run_config_validate({"stop": {"outer_steps": 1}, "learners": {"ranks": 2, "sharding": "fsdp"}})
    assert RunConfig(cfg).sharding == "fsdp"
    assert RunConfig({"learners": {"count": 1}}).sharding == "ddp"  # a config stored before it
    assert RunConfig(run_config_validate({"stop": {"outer_steps": 1}})).sharding == "ddp"
    assert _errors({"stop": {"outer_steps": 1}, "learners": {"sharding": "fsdp"}}) == {
        "learners.sharding": ["fsdp shards a learner over its ranks: set learners.ranks to 2 or more"]
    }
    assert _errors({"stop": {"outer_steps": 1}, "learners": {"ranks": 2, "sharding": "zero3"}}) == {
        "learners.sharding": ["must be one of ddp, fsdp"]
    }
