"""A run config at its limits, from the API, the launch form and `manage.py train`: money within its
column, finite numbers, bounded nesting, ISO currencies and ASCII digits, refused by field and
nothing created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from tests.factories import api_client
from training.models import TrainingRun
from training.run_config import RunConfigError, run_config_validate

pytestmark = pytest.mark.django_db

DEEP = 100_000
STOP = {"stop": {"outer_steps": 3}}


def _form(user: User, **data: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.post("/training/new/", {"name": "run", **data})
    assert response.status_code == 400, response.status_code
    assert not TrainingRun.objects.exists()
    return response.content.decode()


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({**STOP, "money_budget": "1e11"}, "money_budget", "too large"),
        ({**STOP, "money_budget": "١٢"}, "money_budget", "ASCII digits"),
        ({**STOP, "money_budget": 10**30}, "money_budget", "too large"),
        ({**STOP, "currency": "€€€"}, "currency", "ISO 4217"),
        ({**STOP, "currency": "XQZ"}, "currency", "ISO 4217"),
        ({"stop": {"outer_steps": 2**64}}, "stop.outer_steps", "at most"),
        ({**STOP, "seed": 2**64}, "seed", "at most"),
        ({**STOP, "inner": {"grad_clip": 10**400}}, "inner.grad_clip", "finite"),
        ({**STOP, "placement": {"pins": {"١": "x"}}}, "placement.pins", "not a learner index"),
    ],
)
def test_the_api_refuses_a_config_outside_its_columns_and_types_naming_the_field(
    operator: User, config: dict[str, object], field: str, message: str
) -> None:
    response = api_client(operator).post(
        "/api/training-runs/", {"name": "r", "config": config}, format="json"
    )
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()[field])
    assert not TrainingRun.objects.exists()


def test_the_api_refuses_a_deeply_nested_config_before_validating_it(operator: User) -> None:
    body = (
        '{"name": "r", "config": {"stop": {"outer_steps": 3}, "placement": ' + "[" * DEEP + "]" * DEEP + "}}"
    )
    response = api_client(operator).post("/api/training-runs/", body, content_type="application/json")
    assert response.status_code == 400
    assert "nested more than" in response.json()["detail"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("inner:\n  lr: .nan\nstop:\n  outer_steps: 3\n", "inner.lr: not a finite number"),
        ("inner:\n  grad_clip: .inf\nstop:\n  outer_steps: 3\n", "inner.grad_clip: not a finite number"),
        ("placement: " + "[" * DEEP, "nested more than"),
        ("a:\n" + "".join(f"{'  ' * i}b{i}:\n" for i in range(1, 80)), "nested more than 64"),
        ('{"stop": ' + "[" * DEEP + "]" * DEEP + "}", "nested more than"),
        ('{"stop": {"outer_steps": 3}, "inner": {"lr": NaN}}', "not valid JSON"),
    ],
)
def test_the_launch_form_refuses_a_config_with_nan_infinity_or_deep_nesting(
    operator: User, config: str, message: str
) -> None:
    page = _form(operator, config=config)
    assert message in page


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("money_budget", "1e11", "no more than 11 digits before the decimal point"),
        ("money_budget", "١٢", "ASCII digits"),
        ("learners", "١٢", "ASCII digits"),
        ("outer_steps", "²", "ASCII digits"),
    ],
)
def test_the_launch_form_refuses_simple_fields_outside_their_columns(
    operator: User, field: str, value: str, message: str
) -> None:
    page = _form(operator, config="stop:\n  outer_steps: 3\n", **{field: value})
    assert message in page


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("inner:\n  lr: .inf\nstop:\n  outer_steps: 3\n", ".yaml", "inner.lr: not a finite number"),
        ("[" * DEEP, ".yaml", "nested more than"),
        ("[" * DEEP + "]" * DEEP, ".json", "nested more than"),
        ('{"stop": {"outer_steps": 3}, "money_budget": "1e11"}', ".json", "money_budget: too large"),
        ("stop:\n  outer_steps: 3\ncurrency: €€€\n", ".yaml", "currency: must be an ISO 4217"),
    ],
)
def test_the_train_command_exits_non_zero_with_one_line_for_a_bad_config(
    tmp_path: Path, text: str, suffix: str, message: str
) -> None:
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    with pytest.raises(CommandError) as caught:
        call_command("train", "--config", str(path), "--no-wait")
    assert "\n" not in str(caught.value)
    assert message in str(caught.value)
    assert not TrainingRun.objects.exists()


@pytest.mark.parametrize("interval", ["nan", "inf", "١"])
def test_the_train_command_refuses_an_interval_that_is_no_number_of_seconds(
    tmp_path: Path, interval: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(STOP))
    with pytest.raises(CommandError, match="--interval"):
        call_command("train", "--config", str(path), "--interval", interval, "--no-wait")


def test_the_train_command_refuses_a_directory_or_a_binary_file_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot read it"):
        call_command("train", "--config", str(tmp_path), "--no-wait")
    binary = tmp_path / "run.yaml"
    binary.write_bytes(b"\xff\xfe\x00stop")
    with pytest.raises(CommandError, match="cannot read it"):
        call_command("train", "--config", str(binary), "--no-wait")


def test_a_money_budget_within_its_column_is_kept_exactly() -> None:
    cfg = run_config_validate({**STOP, "money_budget": "99999999999.999999999", "currency": "eur"})
    assert cfg["money_budget"] == "99999999999.999999999" and cfg["currency"] == "EUR"
    with pytest.raises(RunConfigError):
        run_config_validate({**STOP, "money_budget": "100000000000"})
