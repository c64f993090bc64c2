"""`manage.py train --config FILE`: one readable line and exit 1 on a bad config; launches a good one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from training.models import TrainingRun


@pytest.mark.django_db
def test_a_bad_config_is_one_line_naming_the_fields_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("learners:\n  count: 2\n  quorum: 5\nstop:\n  outer_steps: 3\nbogus: 1\n")
    with pytest.raises(CommandError) as info:
        call_command("train", "--config", str(path), "--no-wait")
    message = str(info.value)
    assert "\n" not in message
    assert "learners.quorum: must be between 1 and learners.count (2)" in message
    assert "bogus: unknown field" in message
    assert not TrainingRun.objects.exists()


@pytest.mark.django_db
def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no such file"):
        call_command("train", "--config", str(tmp_path / "missing.yaml"), "--no-wait")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(CommandError, match="not valid YAML/JSON"):
        call_command("train", "--config", str(broken), "--no-wait")


@pytest.mark.django_db
def test_a_good_config_launches_a_pending_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"stop": {"outer_steps": 2}}))
    call_command("train", "--config", str(path), "--no-wait")
    run = TrainingRun.objects.get()
    assert run.name == "tiny" and run.state == TrainingRun.State.PENDING
    assert f"run #{run.pk} tiny created (pending)" in capsys.readouterr().out
