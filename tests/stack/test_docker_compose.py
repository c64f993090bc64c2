"""docker-compose.yml stays runnable: no Docker engine here, so parse and check it."""

from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands

COMPOSE = Path(settings.BASE_DIR) / "docker-compose.yml"
# The one web server configuration (the Dockerfile, the docs' systemd unit and the bench run it too).
GUNICORN_CONF = "stack/gunicorn_conf.py"
WEB_COMMAND = ["gunicorn", "-c", GUNICORN_CONF, "stack.wsgi:application"]
APP_SERVICES = {"init", "web", "beat", "control", "worker-onprem-a100", "worker-aws-g5-use1"}


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _argv(command: Any) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def _check_project_command(argv: list[str]) -> None:
    """Every command an app service runs must exist in this project."""
    if argv[:2] == ["sh", "-c"]:
        for part in argv[2].split("&&"):
            _check_project_command(shlex.split(part))
        return
    if argv[:2] == ["python", "manage.py"]:
        assert argv[2] in get_commands(), f"no management command {argv[2]!r}"
        return
    if argv[0] == "gunicorn":
        assert argv[1:3] == ["-c", GUNICORN_CONF] and (Path(settings.BASE_DIR) / argv[2]).is_file()
        module, _, attr = argv[3].partition(":")
        assert hasattr(importlib.import_module(module), attr or "application")
        return
    if argv[0] == "celery":
        assert argv[1:3] == ["-A", "stack"]
        importlib.import_module("stack.celery")
        return
    raise AssertionError(f"unexpected command {argv}")


def test_the_compose_file_describes_the_production_shape() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "minio"} <= services.keys()
    assert APP_SERVICES <= services.keys()
    # Two example cluster workers, each on its own cluster queue.
    workers = [s for s in services if s.startswith("worker-")]
    assert len(workers) >= 2
    for name in workers:
        argv = _argv(services[name]["command"])
        assert argv[2:4] == ["worker", "--cluster"] and name == f"worker-{argv[4]}"


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in _compose()["services"].items():
        if name == "init":
            assert service["restart"] == "no"
            continue
        assert "healthcheck" in service, f"{name} has no healthcheck"
        assert service["healthcheck"]["test"], name


def test_every_long_running_service_is_restarted_when_it_exits() -> None:
    for name, service in _compose()["services"].items():
        if name != "init":
            assert service.get("restart") in ("always", "unless-stopped"), name


def test_every_app_service_runs_a_command_that_exists_in_the_project() -> None:
    services = _compose()["services"]
    for name in APP_SERVICES:
        _check_project_command(_argv(services[name]["command"]))
        check = services[name].get("healthcheck", {}).get("test")
        if check and check[0] == "CMD-SHELL":
            _check_project_command(shlex.split(check[1].replace("$$", "$")))
        elif check and check[0] == "CMD" and check[1:3] == ["python", "manage.py"]:
            _check_project_command(check[1:])


def test_app_services_get_their_configuration_from_the_environment() -> None:
    services = _compose()["services"]
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert env["SWITCHYARD_ENV"] == "production"
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://")
        assert env["OBJECT_STORE_URL"].startswith("s3://")
        assert "${SECRET_KEY:?" in env["SECRET_KEY"]  # required, never defaulted


def test_the_app_services_environment_starts_production_mode(tmp_path: Path) -> None:
    """The web service's environment, as compose fills it in, is enough for production's checks
    (a secret key, allowed hosts); and plain HTTP on port 8000 is not redirected to HTTPS."""
    import os
    import re
    import secrets
    import subprocess
    import sys

    raw = _compose()["services"]["web"]["environment"]

    def fill(value: str) -> str:
        value = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: secrets.token_urlsafe(50), value)
        return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)

    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV"}}
    env.update({name: fill(str(value)) for name, value in raw.items()})
    env["SWITCHYARD_VAR_DIR"] = str(tmp_path / "var")
    code = "from django.conf import settings as s; print(s.PRODUCTION, s.DEBUG, s.SECURE_SSL_REDIRECT, s.ALLOWED_HOSTS)"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "True False False ['localhost', '127.0.0.1', 'web']"


def test_the_web_service_runs_the_one_web_server_configuration() -> None:
    """docker-compose, the Dockerfile's CMD and the docs' systemd unit start gunicorn the same
    way: with stack/gunicorn_conf.py and no flag of their own that would override it."""
    import json

    assert _argv(_compose()["services"]["web"]["command"]) == WEB_COMMAND
    base = Path(settings.BASE_DIR)
    cmd = [line for line in (base / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert [json.loads(line.removeprefix("CMD ")) for line in cmd] == [WEB_COMMAND]
    units = [
        line.removeprefix("ExecStart=")
        for line in (base / "docs" / "production.md").read_text().splitlines()
        if line.startswith("ExecStart=") and "gunicorn" in line
    ]
    assert units and all(shlex.split(unit)[1:] == WEB_COMMAND[1:] for unit in units), units


# --- Prometheus and Grafana ------------------------------------------------------------------

DEPLOY = Path(settings.BASE_DIR) / "deploy"
DASHBOARD = DEPLOY / "grafana" / "switchyard.json"


def _mounted_files(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts of files from this repository: path inside -> file here."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = Path(settings.BASE_DIR) / source
    return mounts


def test_every_published_port_but_the_web_entry_is_bound_to_loopback() -> None:
    """Grafana and Prometheus show every team's series with no team limits: reachable from the
    host only (an SSH tunnel), never from the network. The web service is the one entry."""
    published = {
        name: [str(port) for port in service.get("ports", [])]
        for name, service in _compose()["services"].items()
        if service.get("ports")
    }
    assert published.pop("web") == ["8000:8000"]
    assert published, "grafana and prometheus publish ports"
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("127.0.0.1:") and port.count(":") == 2, (name, port)


def test_prometheus_scrapes_the_web_services_metrics_with_the_token() -> None:
    compose = _compose()
    prometheus = compose["services"]["prometheus"]
    mounts = _mounted_files(prometheus)
    assert all(path.is_file() for path in mounts.values()), mounts
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    assert f"--config.file={'/etc/prometheus/prometheus.yml'}" in prometheus["command"]
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    web_port = compose["services"]["web"]["ports"][0].split(":")[-1]
    assert job["static_configs"][0]["targets"] == [f"web:{web_port}"]
    # The token reaches Prometheus as a secret file made from the variable the web service reads.
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/metrics_token"}
    assert prometheus["secrets"] == ["metrics_token"]
    assert compose["secrets"]["metrics_token"] == {"environment": "SWITCHYARD_METRICS_TOKEN"}
    assert (
        "${SWITCHYARD_METRICS_TOKEN:?"
        in compose["services"]["web"]["environment"]["SWITCHYARD_METRICS_TOKEN"]
    )


def test_grafana_is_provisioned_with_the_prometheus_source_and_the_dashboard() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = _mounted_files(grafana)
    assert all(path.is_file() for path in mounts.values()), mounts
    assert "${GRAFANA_ADMIN_PASSWORD:?" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    sources = yaml.safe_load(mounts["/etc/grafana/provisioning/datasources/prometheus.yml"].read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load(mounts["/etc/grafana/provisioning/dashboards/switchyard.yml"].read_text())
    folder = providers["providers"][0]["options"]["path"]
    dashboards = {target: path for target, path in mounts.items() if target.startswith(folder + "/")}
    assert list(dashboards.values()) == [DASHBOARD]
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] in dashboards
    # Every panel queries that data source.
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"]["uid"] == source["uid"] for p in panels)


@pytest.mark.django_db
def test_the_dashboard_queries_only_series_that_metrics_exports(
    admin_user: Any, settings: Any, tmp_path: Path
) -> None:
    """Every metric name in the dashboard's queries is on /metrics once the stack has served a
    request with a failover, holds a budget and has trained a chunk."""
    from tests.stack.test_metrics import populated_scrape

    settings.OBJECT_STORE_URL = f"file://{tmp_path}"
    exported = set(populated_scrape(admin_user))
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\bswitchyard_[a-z0-9_]+", target["expr"])
    }
    assert queried and queried <= exported, sorted(queried - exported)
    # And the dashboard shows every series the app exports.
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", name) for name in exported}
    shown = {re.sub(r"_(total|bucket|count|sum|created)$", "", name) for name in queried}
    assert {f for f in families if f.startswith("switchyard_")} <= shown
