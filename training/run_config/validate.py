"""run_config_validate: every problem of a raw config, by dotted field path, or the normalised dict."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings

from registry.validation import (
    BIGINT_MAX,
    InputError,
    currency_parse,
    decimal_check,
    decimal_parse,
    int_parse,
    text_check,
)
from training.run_config.build_or_buy import check_build_or_buy
from training.run_config.schema import (
    BOOLS,
    CHOICES,
    DEFAULTS,
    FLOAT_RANGES,
    INT_RANGES,
    MONEY_DECIMAL_PLACES,
    MONEY_MAX_DIGITS,
    START_MODES,
    TEAM_MAX_LENGTH,
    Errors,
    RunConfigError,
    check_float,
    check_int,
    get_path,
    merge_defaults,
)
from training.run_config.sources import check_uris

if TYPE_CHECKING:
    from registry.store.keys import ObjectReach


def run_config_validate(raw: Any, *, reach: ObjectReach | None = None) -> dict[str, Any]:
    """The normalised config, or RunConfigError with every problem found (not just the first).

    `reach`: which keys of the installation's object store the caller may name for this run (its
    own team's: registry.store.keys); None checks no owner (no caller: `manage.py train`)."""
    errors = Errors()
    if not isinstance(raw, dict):
        raise RunConfigError({"config": ["must be a JSON object"]})
    if "object_store_url" in raw:
        # Runs write to the installation's store (OBJECT_STORE_URL, with its endpoint and
        # credentials); a run that chose its own would use those credentials elsewhere.
        errors.add(
            "object_store_url", "a run cannot choose its object store: every run uses OBJECT_STORE_URL"
        )
        raw = {k: v for k, v in raw.items() if k != "object_store_url"}
    raw = _apply_start_from(raw, errors)
    cfg = merge_defaults(raw, DEFAULTS, errors)
    for path, (ilo, ihi) in INT_RANGES.items():
        if not errors.has(path.split(".")[0]):
            check_int(cfg, path, ilo, ihi, errors)
    for path, (flo, fhi) in FLOAT_RANGES.items():
        if not errors.has(path.split(".")[0]):
            check_float(cfg, path, flo, fhi, errors)
    for path, choices in CHOICES.items():
        if not errors.has(path.split(".")[0]) and get_path(cfg, path) not in choices:
            errors.add(path, f"must be one of {', '.join(choices)}")
    for path in BOOLS:
        if not errors.has(path.split(".")[0]) and not isinstance(get_path(cfg, path), bool):
            errors.add(path, "must be true or false")
    if errors.by_field.keys() & {"model", "learners", "fragments", "inner", "syncer", "placement", "data"}:
        raise RunConfigError(errors.by_field)

    model = cfg["model"]
    byo_model = cfg["model_uri"] is not None
    if (
        not byo_model
        and not errors.has("model.n_embd")
        and not errors.has("model.n_head")
        and model["n_embd"] % model["n_head"]
    ):
        errors.add("model.n_head", "must divide model.n_embd")
    check_uris(cfg, raw, errors, reach=reach)
    down = cfg["compression"]["down"]
    if not errors.has("compression") and down is not None and down not in CHOICES["compression.kind"]:
        errors.add(
            "compression.down",
            f"must be null (as compression.kind) or one of {', '.join(CHOICES['compression.kind'])}",
        )

    learners = cfg["learners"]
    m = learners["count"] if isinstance(learners["count"], int) else 1
    if learners["quorum"] is None:
        learners["quorum"] = m
    elif isinstance(learners["quorum"], bool) or not isinstance(learners["quorum"], int):
        errors.add("learners.quorum", "must be an integer")
    elif not 1 <= learners["quorum"] <= m:
        errors.add("learners.quorum", f"must be between 1 and learners.count ({m})")
    ranks, batch = learners["ranks"], learners["batch_size"]
    if learners["sharding"] == "fsdp" and not errors.has("learners.ranks") and ranks < 2:
        errors.add(
            "learners.sharding", "fsdp shards a learner over its ranks: set learners.ranks to 2 or more"
        )
    if not errors.has("learners.ranks") and not errors.has("learners.batch_size") and batch % ranks:
        errors.add(
            "learners.ranks", f"must divide learners.batch_size ({batch}): each rank draws batch_size / ranks"
        )

    frags = cfg["fragments"]
    if (
        not byo_model  # the layer count is in the model's config.json, checked when the run starts
        and isinstance(frags["count"], int)
        and isinstance(model["n_layer"], int)
        and frags["count"] > model["n_layer"]
    ):
        errors.add("fragments.count", f"must be at most model.n_layer ({model['n_layer']})")
    if isinstance(frags["overlap"], int) and isinstance(cfg["h"], int) and frags["overlap"] >= cfg["h"]:
        errors.add("fragments.overlap", "must be less than h")
    if isinstance(cfg["h"], int) and isinstance(frags["count"], int) and cfg["h"] < frags["count"]:
        errors.add("h", "must be at least fragments.count")

    inner = cfg["inner"]
    if inner["total_steps"] is not None:
        if isinstance(inner["total_steps"], bool) or not isinstance(inner["total_steps"], int):
            errors.add("inner.total_steps", "must be an integer or null")
        elif not 1 <= inner["total_steps"] <= BIGINT_MAX:
            errors.add("inner.total_steps", f"must be between 1 and {BIGINT_MAX}")

    _check_stop(cfg, errors)
    _check_money(cfg, errors)
    _check_placement(cfg, m, errors)
    check_build_or_buy(cfg, errors)

    # A chunk must finish well inside the broker's visibility timeout, or Redis hands the same
    # message to a second worker while the first still trains it.
    # (The filesystem broker's options hold folders, and no visibility timeout.)
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout")
    if (
        isinstance(visibility, int | float)
        and visibility
        and isinstance(cfg["chunk_seconds"], float)
        and cfg["chunk_seconds"] >= visibility / 2
    ):
        errors.add("chunk_seconds", f"must be less than half the broker visibility timeout ({visibility}s)")
    if (
        not errors.has("learner_timeout")
        and not errors.has("chunk_seconds")
        and cfg["learner_timeout"] <= 2 * cfg["chunk_seconds"]
    ):
        errors.add("learner_timeout", "must be more than twice chunk_seconds")

    if errors.by_field:
        raise RunConfigError(errors.by_field)
    if inner["total_steps"] is None:
        inner["total_steps"] = default_total_steps(cfg)
    return cfg


ARCHITECTURE = ("n_layer", "n_embd", "n_head", "block_size")


def _apply_start_from(raw: dict[str, Any], errors: Errors) -> dict[str, Any]:
    """`raw` with `start_from` resolved to a model version and the model (and, to continue, the
    data) taken from it; unchanged, with field errors, when it names nothing usable."""
    start = raw.get("start_from")
    if start is None:
        return raw
    if not isinstance(start, dict):
        errors.add(
            "start_from", 'must be an object: {"model_version": "<model>@<number>", "mode": "continue"}'
        )
        return raw
    # label, artifact_uri and layout are what normalising adds; they are resolved again here.
    for key in sorted(set(start) - {"model_version", "mode", "label", "artifact_uri", "layout"}):
        errors.add(f"start_from.{key}", "unknown field")
    mode = start.get("mode", "continue")
    if mode not in START_MODES:
        errors.add("start_from.mode", f"must be one of {', '.join(START_MODES)}")
    # Imported here, not at the top: RunConfig is also used where Django is not set up (the
    # benchmark's bare-engine processes), and models cannot load there.
    from training.selectors import model_version_lookup

    ref = start.get("model_version")
    version = model_version_lookup(ref)
    if version is None:
        shown = ref if isinstance(ref, str | int) and not isinstance(ref, bool) else "null"
        errors.add(
            "start_from.model_version",
            f"no model version {shown!r}: give <model slug>@<number> or a model version id",
        )
        return raw
    if errors.has("start_from.mode") or any(k.startswith("start_from.") for k in errors.by_field):
        return raw
    out = copy.deepcopy(raw)
    source = version.run.config
    if mode == "continue":
        if "dataset" not in raw and "dataset" in source:
            out["dataset"] = source["dataset"]
        if isinstance(source.get("data"), dict) and isinstance(raw.get("data", {}), dict):
            out["data"] = {**copy.deepcopy(source["data"]), **raw.get("data", {})}
    if raw.get("model_uri") is not None:
        errors.add("model_uri", "start_from gives the model: leave model_uri empty")
    if "model" in raw and not isinstance(raw["model"], dict):
        return out  # merge_defaults reports it
    model_raw = raw.get("model", {})
    if version.layout == version.Layout.OPEN_WEIGHTS:
        for key in sorted(set(model_raw) - {"block_size"}):
            errors.add(f"model.{key}", "comes from start_from's model version (only block_size may be given)")
        block = model_raw.get("block_size")
        if block is None and mode == "continue":
            block = source.get("model", {}).get("block_size")
        out["model"] = {"block_size": block} if block is not None else {}
        out["model_uri"] = version.artifact_uri
    else:
        # A byte-level GPT: its architecture is fixed by the weights; only dropout may change.
        source_model = dict(source.get("model", {}))
        for key in ARCHITECTURE:
            if key in model_raw and model_raw[key] != source_model.get(key):
                errors.add(f"model.{key}", f"must be {source_model.get(key)} (start_from's model version)")
        out["model"] = {**source_model, **model_raw}
        out["model_uri"] = None  # reported above if given
    out["start_from"] = {
        "model_version": version.pk,
        "label": str(version),
        "mode": mode,
        "artifact_uri": version.artifact_uri,
        "layout": version.layout,
    }
    return out


def default_total_steps(cfg: dict[str, Any]) -> int:
    """Length of each learner's cosine schedule: about the inner steps it will take."""
    stop = cfg["stop"]
    if "outer_steps" in stop:
        return max(1, int(stop["outer_steps"]) * int(cfg["h"]))
    per_step = cfg["learners"]["count"] * cfg["learners"]["batch_size"] * cfg["model"]["block_size"]
    return max(1, int(stop["token_budget"]) // per_step)


def _check_stop(cfg: dict[str, Any], errors: Errors) -> None:
    stop = cfg["stop"]
    if not isinstance(stop, dict):
        errors.add("stop", "required: {outer_steps: N} or {token_budget: N}")
        return
    keys = set(stop)
    unknown = keys - {"outer_steps", "token_budget"}
    for k in sorted(unknown):
        errors.add(f"stop.{k}", "unknown field")
    given = keys & {"outer_steps", "token_budget"}
    if len(given) != 1:
        errors.add("stop", "give exactly one of outer_steps or token_budget")
        return
    (key,) = given
    value = stop[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.add(f"stop.{key}", "must be a positive integer")
    elif value > BIGINT_MAX:
        errors.add(f"stop.{key}", f"must be at most {BIGINT_MAX}")


def _check_money(cfg: dict[str, Any], errors: Errors) -> None:
    raw = cfg["money_budget"]
    if raw is not None:
        if isinstance(raw, float | bool) or not isinstance(raw, str | int):
            # Floats are refused rather than rounded: money is a decimal string.
            errors.add("money_budget", 'must be a decimal string such as "12.50"')
        else:
            try:
                # The column's limits (TrainingRun.money_budget), in ASCII digits.
                amount = (
                    decimal_parse(raw, max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_DECIMAL_PLACES)
                    if isinstance(raw, str)
                    else decimal_check(
                        Decimal(raw), max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_DECIMAL_PLACES
                    )
                )
            except InputError as exc:
                message = str(exc)
                if message.startswith(("not a decimal", "write the number")):
                    message = f'must be a decimal string such as "12.50" ({message})'
                elif message.startswith("not a finite"):
                    message = "must be more than 0"
                errors.add("money_budget", message)
            else:
                if amount <= 0:
                    errors.add("money_budget", "must be more than 0")
                else:
                    cfg["money_budget"] = str(amount)
    cur = cfg["currency"]
    try:
        cfg["currency"] = currency_parse(cur) if isinstance(cur, str) else currency_parse("")
    except InputError as exc:
        errors.add("currency", f"must be an ISO 4217 currency code ({exc})")
    team = cfg["team"]
    if not isinstance(team, str):
        errors.add("team", "must be a team name (a string)")
    elif len(team.strip()) > TEAM_MAX_LENGTH:
        # The ledger's and the budgets' team column.
        errors.add("team", f"at most {TEAM_MAX_LENGTH} characters")
    else:
        try:
            cfg["team"] = text_check(team.strip())
        except InputError as exc:
            errors.add("team", str(exc))


def _check_placement(cfg: dict[str, Any], m: int, errors: Errors) -> None:
    place = cfg["placement"]
    if not isinstance(place["accelerator_type"], str):
        errors.add("placement.accelerator_type", "must be a string")
    regions = place["regions"]
    if not isinstance(regions, list) or not all(isinstance(r, str) and r for r in regions):
        errors.add("placement.regions", "must be a list of region names")
    pins = place["pins"]
    if not isinstance(pins, dict):
        errors.add("placement.pins", "must map learner index to cluster slug")
        return
    # Imported here, not at the top: RunConfig is also used where Django is not set up (the
    # benchmark's bare-engine learner processes, bench.training.bare), and models cannot load there.
    from registry.models import Cluster

    evaluator = place.get("eval_cluster")
    if evaluator is not None and (
        not isinstance(evaluator, str) or not Cluster.objects.filter(slug=evaluator).exists()
    ):
        errors.add("placement.eval_cluster", f"no cluster {evaluator!r}")
    normalised: dict[str, str] = {}
    slots = {
        slug: max(1, count // max(1, capacity))  # training.selectors.accelerators_per_learner
        for slug, count, capacity in Cluster.objects.filter(
            slug__in=[s for s in pins.values() if isinstance(s, str)]
        ).values_list("slug", "accelerator_count", "capacity")
    }
    known = set(slots)
    ranks = cfg["learners"]["ranks"]
    for key, slug in pins.items():
        try:
            index = key if isinstance(key, int) and not isinstance(key, bool) else int_parse(str(key))
        except InputError:
            errors.add("placement.pins", f"{key!r} is not a learner index")
            continue
        if not 0 <= index < m:
            errors.add("placement.pins", f"learner {index} does not exist (0..{m - 1})")
        elif not isinstance(slug, str) or slug not in known:
            errors.add("placement.pins", f"learner {index}: no cluster {slug!r}")
        elif isinstance(ranks, int) and slots[slug] < ranks:
            errors.add(
                "learners.ranks",
                f"learner {index} is pinned to {slug}, whose learner slots hold {slots[slug]} accelerator(s)",
            )
        else:
            normalised[str(index)] = slug
    place["pins"] = normalised
