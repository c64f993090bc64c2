"""Production mode, run for real: `manage.py check --deploy` passes with the environment file that
docs/production.md documents, the process refuses to start without a secret key or allowed hosts, and the
Docker image runs in production mode."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
# Whatever the test run itself was given (DATABASE_URL, REDIS_URL, DEBUG...) must not leak into
# the child: it gets the documented file and nothing else the settings read.
_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH"}


def documented_production_env() -> dict[str, str]:
    """The `/etc/switchyard/env` block of docs/production.md's "Running in production", `…` filled in."""
    page = (ROOT / "docs" / "production.md").read_text()
    block = re.search(r"`/etc/switchyard/env`.*?```sh\n(.*?)```", page, re.DOTALL)
    assert block, "docs/production.md lost its production environment file"
    env: dict[str, str] = {}
    for line in block.group(1).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        env[name] = value
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["DATABASE_URL"] = env["DATABASE_URL"].replace("…", "db-password")
    assert "…" not in "".join(env.values()), env
    return env


def _manage(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k in _KEEP}
    child_env.update(env)
    child_env["SWITCHYARD_VAR_DIR"] = str(tmp_path / "var")
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_check_deploy_passes_without_a_warning_with_the_documented_production_env(tmp_path: Path) -> None:
    env = documented_production_env()
    assert env["SWITCHYARD_ENV"] == "production"
    result = _manage(tmp_path, env, "check", "--deploy", "--fail-level", "WARNING")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues (0 silenced)." in output
    assert "WARNING" not in output


def test_check_deploy_names_what_is_missing_when_https_is_switched_off(tmp_path: Path) -> None:
    env = documented_production_env() | {"SECURE_SSL_REDIRECT": "false", "SECURE_HSTS_SECONDS": "0"}
    result = _manage(tmp_path, env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W008" in result.stderr


@pytest.mark.parametrize(
    ("missing", "message"), [("SECRET_KEY", "SECRET_KEY"), ("ALLOWED_HOSTS", "ALLOWED_HOSTS")]
)
def test_production_refuses_to_start_without(tmp_path: Path, missing: str, message: str) -> None:
    env = documented_production_env()
    del env[missing]
    result = _manage(tmp_path, env, "check")
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message} must be set" in result.stderr


# --- The settings the check asks for, at work in a request ---------------------------------------


def test_without_trusted_proxies_x_forwarded_proto_is_not_believed(settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    assert not hasattr(settings, "SECURE_PROXY_SSL_HEADER") or settings.SECURE_PROXY_SSL_HEADER is None
    response = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/login/"


@pytest.mark.django_db
def test_behind_a_trusted_proxy_https_is_recognised_and_hsts_sent(settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_HSTS_PRELOAD = True
    response = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"


@pytest.mark.django_db
def test_healthz_is_not_redirected_so_inside_health_checks_keep_working(settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    assert Client().get("/healthz").status_code in (200, 503)
    assert Client().get("/login/").status_code == 301


# --- The Docker image --------------------------------------------------------------------------------


def test_the_docker_image_runs_in_production_mode_by_default() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    env_lines = [line for line in dockerfile.splitlines() if line.startswith("ENV ")]
    assert any(re.search(r"\bSWITCHYARD_ENV=production\b", line) for line in env_lines), env_lines
    cmd = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert cmd and "gunicorn" in cmd[-1]
    # The build step runs under the image's ENV, so it too must satisfy production's requirements.
    collectstatic = next(line for line in dockerfile.splitlines() if "collectstatic" in line)
    assert "SECRET_KEY=" in collectstatic and "ALLOWED_HOSTS=" in collectstatic
