"""The typed environment readers, and the settings module that uses them."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from stack.env import env_bool, env_float, env_int, env_list, env_str, env_url

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "stack" / "settings" / "__init__.py"

# Variables the settings module reads; each settings test starts from none of them.
SETTINGS_VARIABLES = [
    "SWITCHYARD_ENV",
    "SWITCHYARD_METRICS",
    "SWITCHYARD_METRICS_TOKEN",
    "SWITCHYARD_METRICS_ALLOW_NETWORKS",
    "SWITCHYARD_METRICS_CACHE_SECONDS",
    "SECRET_KEY",
    "CREDENTIALS_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "DATABASE_URL",
    "DB_CONN_MAX_AGE",
    "DB_CONNECT_TIMEOUT",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_VISIBILITY_TIMEOUT",
    "CELERY_TASK_ALWAYS_EAGER",
    "OBJECT_STORE_URL",
    "OBJECT_STORE_ENDPOINT_URL",
    "SWITCHYARD_HEARTBEAT_SECONDS",
    "SWITCHYARD_DEGRADED_AFTER_SECONDS",
    "SWITCHYARD_DOWN_AFTER_SECONDS",
    "SWITCHYARD_HEALTH_CHECK_SECONDS",
    "SWITCHYARD_TRUSTED_PROXIES",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SWITCHYARD_LOGIN_FAILURE_LIMIT",
    "SWITCHYARD_LOGIN_COOLOFF_SECONDS",
    "SWITCHYARD_INFERENCE_RECORDING",
    "SWITCHYARD_ANOMALY_MIN_AMOUNT",
    "INFERENCE_BREAKER_FAILURE_RATE",
    "INFERENCE_BREAKER_MIN_REQUESTS",
    "INFERENCE_BREAKER_WINDOW_CALLS",
    "INFERENCE_BREAKER_WINDOW_SECONDS",
    "INFERENCE_BREAKER_COOLDOWN_SECONDS",
    "INFERENCE_DEADLINE_SECONDS",
    "INFERENCE_MAX_ROUNDS",
    "INFERENCE_BACKOFF_SECONDS",
    "INFERENCE_MAX_RETRY_AFTER_SECONDS",
    "EVAL_RUN_STALE_SECONDS",
]


# --- The helpers --------------------------------------------------------------------------


def test_env_str_returns_the_value_or_the_default() -> None:
    assert env_str("NAME", "fallback", environ={"NAME": "given"}) == "given"
    assert env_str("NAME", "fallback", environ={}) == "fallback"


def test_env_str_without_a_default_fails_naming_the_variable() -> None:
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        env_str("SECRET_KEY", environ={})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("false", False), ("", False)],
)
def test_env_bool_parses_the_usual_spellings(raw: str, expected: bool) -> None:
    assert env_bool("FLAG", not expected, environ={"FLAG": raw}) is expected


def test_env_bool_uses_the_default_when_unset() -> None:
    assert env_bool("FLAG", True, environ={}) is True


def test_env_bool_rejects_anything_else_naming_the_variable_and_value() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"DEBUG must be a boolean.*'maybe'"):
        env_bool("DEBUG", False, environ={"DEBUG": "maybe"})


def test_env_int_parses_integers_and_enforces_the_minimum() -> None:
    assert env_int("N", 3, environ={"N": "42"}) == 42
    assert env_int("N", 3, environ={}) == 3
    with pytest.raises(ImproperlyConfigured, match="N must be >= 60, got 5"):
        env_int("N", 3, minimum=60, environ={"N": "5"})


@pytest.mark.parametrize("raw", ["", "ten", "4.5"])
def test_env_int_rejects_non_integers_naming_the_variable(raw: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="DB_CONN_MAX_AGE must be an integer"):
        env_int("DB_CONN_MAX_AGE", 0, environ={"DB_CONN_MAX_AGE": raw})


def test_env_float_parses_numbers_and_enforces_the_minimum() -> None:
    assert env_float("SECS", 1.0, environ={"SECS": "2.5"}) == 2.5
    with pytest.raises(ImproperlyConfigured, match="SECS must be a number, got 'soon'"):
        env_float("SECS", 1.0, environ={"SECS": "soon"})
    with pytest.raises(ImproperlyConfigured, match="SECS must be >= 0.1"):
        env_float("SECS", 1.0, minimum=0.1, environ={"SECS": "0"})


def test_env_list_splits_on_commas_and_drops_blanks() -> None:
    assert env_list("HOSTS", ["a"], environ={"HOSTS": " x.example , y.example,, "}) == [
        "x.example",
        "y.example",
    ]
    assert env_list("HOSTS", ["a"], environ={}) == ["a"]


@pytest.mark.parametrize(
    "value", ["postgres://u@db:5432/x", "postgresql://db/x", "sqlite:///var/x.sqlite3", "POSTGRES://db/x"]
)
def test_env_url_accepts_the_allowed_schemes(value: str) -> None:
    schemes = ("sqlite", "postgres", "postgresql")
    assert env_url("DATABASE_URL", "sqlite:///x", schemes=schemes, environ={"DATABASE_URL": value}) == value


@pytest.mark.parametrize("value", ["mysql://db/x", "localhost:6379", "db.example/x", ""])
def test_env_url_rejects_other_schemes_naming_the_variable(value: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"REDIS_URL must start with one of redis://, rediss://"):
        env_url("REDIS_URL", "redis://x", schemes=("redis", "rediss"), environ={"REDIS_URL": value})


# --- The settings module, executed for real with a given environment ---------------------------


@pytest.fixture
def load_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Run stack/settings/ afresh with only the given variables set (var/ under tmp)."""

    def load(**env: str) -> dict[str, Any]:
        for name in SETTINGS_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(tmp_path / "var"))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(SETTINGS_FILE))

    return load


def test_settings_with_no_environment_use_the_embedded_defaults(load_settings: Any, tmp_path: Path) -> None:
    loaded = load_settings()
    assert loaded["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert loaded["CELERY_BROKER_URL"] == "filesystem://localhost/"
    assert loaded["OBJECT_STORE_URL"] == f"file://{tmp_path / 'var' / 'objects'}"
    assert loaded["USE_TZ"] is True
    assert loaded["TIME_ZONE"] == "UTC"
    assert loaded["SECRET_KEY"]


def test_settings_parse_good_urls_from_the_environment(load_settings: Any) -> None:
    loaded = load_settings(
        DATABASE_URL="postgres://app:pw@db.internal:5432/switchyard",
        REDIS_URL="redis://cache:6379/2",
        OBJECT_STORE_URL="s3://bucket/prefix",
        OBJECT_STORE_ENDPOINT_URL="http://127.0.0.1:9000",
    )
    database = loaded["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["HOST"], database["PORT"], database["NAME"]) == ("db.internal", 5432, "switchyard")
    assert loaded["CELERY_BROKER_URL"] == "redis://cache:6379/2"
    assert loaded["OBJECT_STORE_URL"] == "s3://bucket/prefix"
    assert loaded["OBJECT_STORE_ENDPOINT_URL"] == "http://127.0.0.1:9000"


def test_a_postgresql_connect_gives_up_after_a_short_timeout(load_settings: Any) -> None:
    # A database that does not answer must not hold a /v1 request (it is answered 503 instead).
    url = "postgres://app@db:5432/switchyard"
    assert load_settings(DATABASE_URL=url)["DATABASES"]["default"]["OPTIONS"]["connect_timeout"] == 2
    options = load_settings(DATABASE_URL=url, DB_CONNECT_TIMEOUT="5")["DATABASES"]["default"]["OPTIONS"]
    assert options["connect_timeout"] == 5
    in_the_url = load_settings(DATABASE_URL=url + "?connect_timeout=7")["DATABASES"]["default"]["OPTIONS"]
    assert in_the_url["connect_timeout"] == 7
    with pytest.raises(ImproperlyConfigured, match="DB_CONNECT_TIMEOUT"):
        load_settings(DATABASE_URL=url, DB_CONNECT_TIMEOUT="1")  # libpq's least is 2 s


@pytest.mark.parametrize("switchyard_env", ["development", "test"])
def test_the_recording_default_follows_the_database_not_the_environment_name(
    load_settings: Any, switchyard_env: str
) -> None:
    # Tests record as production does: the journal on PostgreSQL, inline on SQLite.
    postgres = load_settings(SWITCHYARD_ENV=switchyard_env, DATABASE_URL="postgres://app@db:5432/switchyard")
    assert postgres["INFERENCE_RECORDING"] == "journal"
    assert load_settings(SWITCHYARD_ENV=switchyard_env)["INFERENCE_RECORDING"] == "inline"
    explicit = load_settings(
        SWITCHYARD_ENV=switchyard_env,
        DATABASE_URL="postgres://app@db:5432/switchyard",
        SWITCHYARD_INFERENCE_RECORDING="inline",
    )
    assert explicit["INFERENCE_RECORDING"] == "inline"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "mysql://db/switchyard"),
        ("REDIS_URL", "http://cache:6379"),
        ("CELERY_BROKER_URL", "sqs://queue"),
        ("OBJECT_STORE_URL", "gs://bucket"),
        ("SWITCHYARD_ENV", "staging"),
        ("DEBUG", "perhaps"),
        ("DB_CONN_MAX_AGE", "-1"),
        ("SWITCHYARD_HEARTBEAT_SECONDS", "often"),
        ("SWITCHYARD_LOGIN_FAILURE_LIMIT", "0"),
        ("SWITCHYARD_LOGIN_COOLOFF_SECONDS", "soon"),
        ("SWITCHYARD_TRUSTED_PROXIES", "-1"),
        ("SWITCHYARD_METRICS_TOKEN", "short"),
        ("SWITCHYARD_METRICS_ALLOW_NETWORKS", "10.0.0.0/33"),
        ("SWITCHYARD_METRICS", "maybe"),
    ],
)
def test_settings_refuse_a_bad_value_naming_the_variable(load_settings: Any, name: str, value: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=name):
        load_settings(**{name: value})


def test_production_settings_require_a_secret_key(load_settings: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        load_settings(SWITCHYARD_ENV="production", ALLOWED_HOSTS="switchyard.example.com")
    loaded = load_settings(SWITCHYARD_ENV="production", SECRET_KEY="k" * 50, ALLOWED_HOSTS="sy.example")
    assert loaded["SECRET_KEY"] == "k" * 50
    assert loaded["DEBUG"] is False


def test_production_settings_require_allowed_hosts(load_settings: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="ALLOWED_HOSTS must be set in production"):
        load_settings(SWITCHYARD_ENV="production", SECRET_KEY="k" * 50)
    with pytest.raises(ImproperlyConfigured, match="ALLOWED_HOSTS must be set in production"):
        load_settings(SWITCHYARD_ENV="production", SECRET_KEY="k" * 50, ALLOWED_HOSTS=" , ")
    loaded = load_settings(SWITCHYARD_ENV="production", SECRET_KEY="k" * 50, ALLOWED_HOSTS="sy.example")
    assert loaded["ALLOWED_HOSTS"] == ["sy.example"]


def test_testserver_is_never_an_allowed_host_by_default(load_settings: Any) -> None:
    # Django's test runner adds it for tests; a server must not answer to it.
    assert "testserver" not in load_settings()["ALLOWED_HOSTS"]
    assert "testserver" not in load_settings(SWITCHYARD_ENV="test")["ALLOWED_HOSTS"]


def test_production_turns_on_https_redirects_hsts_and_secure_cookies(load_settings: Any) -> None:
    loaded = load_settings(SWITCHYARD_ENV="production", SECRET_KEY="k" * 50, ALLOWED_HOSTS="sy.example")
    assert loaded["SECURE_SSL_REDIRECT"] is True
    assert loaded["SECURE_HSTS_SECONDS"] > 0
    assert loaded["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert loaded["SESSION_COOKIE_SECURE"] is True and loaded["CSRF_COOKIE_SECURE"] is True
    # No proxy declared: X-Forwarded-Proto could be sent by anyone, so it is not believed.
    assert "SECURE_PROXY_SSL_HEADER" not in loaded


def test_https_redirect_and_hsts_are_settable(load_settings: Any) -> None:
    loaded = load_settings(
        SWITCHYARD_ENV="production",
        SECRET_KEY="k" * 50,
        ALLOWED_HOSTS="sy.example",
        SECURE_SSL_REDIRECT="false",
        SECURE_HSTS_SECONDS="31536000",
        SECURE_HSTS_PRELOAD="no",
    )
    assert loaded["SECURE_SSL_REDIRECT"] is False
    assert loaded["SECURE_HSTS_SECONDS"] == 31536000
    assert loaded["SECURE_HSTS_PRELOAD"] is False


def test_the_proxy_header_is_trusted_only_when_a_proxy_is_declared(load_settings: Any) -> None:
    assert "SECURE_PROXY_SSL_HEADER" not in load_settings(SWITCHYARD_TRUSTED_PROXIES="0")
    loaded = load_settings(SWITCHYARD_TRUSTED_PROXIES="1")
    assert loaded["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")


def test_login_throttling_limits_come_from_the_environment(load_settings: Any) -> None:
    from datetime import timedelta

    defaults = load_settings()
    assert (defaults["AXES_FAILURE_LIMIT"], defaults["AXES_COOLOFF_TIME"]) == (5, timedelta(minutes=15))
    assert defaults["AXES_LOCKOUT_PARAMETERS"] == [["username", "ip_address"]]
    loaded = load_settings(SWITCHYARD_LOGIN_FAILURE_LIMIT="10", SWITCHYARD_LOGIN_COOLOFF_SECONDS="60")
    assert (loaded["AXES_FAILURE_LIMIT"], loaded["AXES_COOLOFF_TIME"]) == (10, timedelta(seconds=60))


def test_settings_refuse_heartbeat_timings_out_of_order(load_settings: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="SWITCHYARD_DEGRADED_AFTER_SECONDS"):
        load_settings(SWITCHYARD_DEGRADED_AFTER_SECONDS="60", SWITCHYARD_DOWN_AFTER_SECONDS="30")


def test_metrics_need_a_token_and_loopback_only_when_allowed_explicitly(load_settings: Any) -> None:
    """/metrics' default (docs/observability.md): nobody without the token, loopback not even;
    SWITCHYARD_METRICS_ALLOW_LOOPBACK opens it to loopback; allowed networks narrow the token."""
    default = load_settings()
    assert default["METRICS_TOKEN"] == "" and default["METRICS_ALLOW_NETWORKS"] == []
    assert default["METRICS_ALLOW_LOOPBACK"] is False
    assert load_settings(SWITCHYARD_METRICS_ALLOW_LOOPBACK="1")["METRICS_ALLOW_LOOPBACK"] is True
    with_token = load_settings(SWITCHYARD_METRICS_TOKEN="t" * 32)
    assert (with_token["METRICS_TOKEN"], with_token["METRICS_ALLOW_NETWORKS"]) == ("t" * 32, [])
    both = load_settings(
        SWITCHYARD_METRICS_TOKEN="t" * 32, SWITCHYARD_METRICS_ALLOW_NETWORKS="10.0.0.0/8, fd00::/8"
    )
    assert both["METRICS_ALLOW_NETWORKS"] == ["10.0.0.0/8", "fd00::/8"]
