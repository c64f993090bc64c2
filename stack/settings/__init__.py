"""Django settings for Switchyard.

Everything configurable comes from the environment through the typed helpers in
`stack.env`. With no environment at all the project runs on embedded defaults
(SQLite file and a filesystem broker under `var/`), which is what `make demo`
uses; production (`SWITCHYARD_ENV=production`) refuses to start without a
SECRET_KEY and ALLOWED_HOSTS, and turns on HTTPS redirects, HSTS and secure cookies.
"""

from __future__ import annotations

import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from stack.env import (
    env_bool,
    env_data_roots,
    env_decimal,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_secret_key,
    env_str,
    env_url,
)
from stack.settings.api import rest_framework_settings, spectacular_settings
from stack.settings.schedule import beat_schedule
from stack.settings.sso import oidc_groups_claim, oidc_settings, sso_lifetimes
from storage.multipart import transfer_from_env

# Lets Django's classes be subscripted at run time (ModelForm[Provider]) as the
# type stubs describe them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parents[2]
VAR_DIR = Path(env_str("SWITCHYARD_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SWITCHYARD_ENV = env_str("SWITCHYARD_ENV", "development")
if SWITCHYARD_ENV not in {"development", "production", "test"}:
    raise ImproperlyConfigured(
        f"SWITCHYARD_ENV must be development, production or test; got {SWITCHYARD_ENV!r}"
    )
PRODUCTION = SWITCHYARD_ENV == "production"


SECRET_KEY = env_secret_key("SECRET_KEY", production=PRODUCTION, var_dir=VAR_DIR)

# Key for credentials at rest; defaults to one derived from SECRET_KEY
# (see registry.crypto). Set it separately to rotate SECRET_KEY independently.
CREDENTIALS_KEY = env_str("CREDENTIALS_KEY", "")
# HMAC key that signed export manifests before Ed25519 (still checks those); empty: derived from SECRET_KEY.
EXPORT_SIGNING_KEY = env_str("EXPORT_SIGNING_KEY", "")
# The Ed25519 key that signs export manifests: PEM text, or a PEM file's path. Neither: outside
# production a key made once under var/ (billing.exports.signing); in production, signing refuses.
EXPORT_ED25519_KEY = env_str("EXPORT_ED25519_KEY", "")
EXPORT_ED25519_KEY_FILE = env_str("EXPORT_ED25519_KEY_FILE", "")
# Paths of PEM public keys that signed earlier exports (after a rotation), comma-separated.
EXPORT_RETIRED_PUBLIC_KEYS = env_list("EXPORT_RETIRED_PUBLIC_KEYS", [])
# The FOCUS BillingAccountId and BillingAccountName of cost exports: this installation.
FOCUS_BILLING_ACCOUNT_ID = env_str("FOCUS_BILLING_ACCOUNT_ID", "switchyard")
FOCUS_BILLING_ACCOUNT_NAME = env_str("FOCUS_BILLING_ACCOUNT_NAME", "Switchyard")

DEBUG = env_bool("DEBUG", default=not PRODUCTION)
if PRODUCTION:
    # No default: the names this installation answers to are the deployer's to give.
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS must be set in production (comma-separated host names)")
else:
    # Loopback only. Django's test runner adds "testserver" itself, so it is never listed here.
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_celery_beat",
    "axes",
    # django-auditlog computes the audit trail's diffs; registry.audit holds the rows (AuditEntry).
    "auditlog",
    "registry.apps.RegistryConfig",
    "billing.apps.BillingConfig",
    "training.apps.TrainingConfig",
    "inference.apps.InferenceConfig",
    "registry.audit.apps.AuditConfig",
    "decisions.apps.DecisionsConfig",
    "stack.apps.SwitchyardConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # /v1 answers OpenAI-style JSON errors only (size limit, unknown paths, Django's error pages).
    "inference.gateway.middleware.GatewayErrorsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Paths, query strings and form posts holding NUL or other control characters answer 400.
    "registry.middleware.InputTextMiddleware",
    # A path under /api/ that matches no route answers 404 in JSON, not an HTML page.
    "registry.middleware.ApiNotFoundMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Which surface and user a change of a tracked object comes from (one ContextVar, no query).
    "registry.audit.middleware.AuditOriginMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a throttled login into the lockout page (stack.login_throttle).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "stack.urls"
WSGI_APPLICATION = "stack.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            # {{ amount|money }} on every page: one rule for how money reads (billing.money).
            "builtins": ["billing.templatetags.money"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # `can_see_costs`: the one rule for money on pages (registry.auth.costs).
                "registry.auth.costs.cost_visibility",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------
DATABASE_URL = env_url(
    "DATABASE_URL",
    f"sqlite:///{VAR_DIR / 'switchyard.sqlite3'}",
    schemes=("sqlite", "postgres", "postgresql", "pgsql"),
)
# Production keeps each web thread's connection (a new one costs PostgreSQL several ms of CPU
# per request); health checks replace a connection the server dropped before a request uses it.
# stack/gunicorn_conf.py sets the same for the web server in every environment.
_db = dj_database_url.parse(
    DATABASE_URL,
    conn_max_age=env_int("DB_CONN_MAX_AGE", 600 if PRODUCTION else 0, minimum=0),
    conn_health_checks=True,
)
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, workers, beat) share the file: WAL lets readers
    # run beside a writer, IMMEDIATE transactions take the write lock up front
    # so two writers queue on `timeout` instead of failing with "locked".
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests start real worker processes, which must see the same database, so
    # the SQLite test database is a file, not pytest's in-memory default.
    # The pid keeps two concurrent test sessions on one checkout apart.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-switchyard-{os.getpid()}.sqlite3")}
else:
    # A database that does not answer must not hold a request until TCP gives up (minutes): the
    # /v1 gateway answers 503 `database_unavailable` instead (inference.gateway.middleware).
    # libpq counts whole seconds, 2 at least; a connect_timeout in DATABASE_URL's query wins.
    _db.setdefault("OPTIONS", {}).setdefault("connect_timeout", env_int("DB_CONNECT_TIMEOUT", 2, minimum=2))
_db["ATOMIC_REQUESTS"] = True  # a failed request writes nothing
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -----------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
AUTHENTICATION_BACKENDS = [
    # First: refuses a throttled username+address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# --- Single sign-on (OpenID Connect, mozilla-django-oidc; docs/registry-and-teams.md "SSO") ---------------
# Off unless OIDC_RP_CLIENT_ID is set; then every other value must be valid (stack.settings.sso).
SWITCHYARD_SSO_SESSION_SECONDS, SWITCHYARD_SSO_KEY_SECONDS = sso_lifetimes()
OIDC_ENABLED = bool(env_str("OIDC_RP_CLIENT_ID", "").strip())
if OIDC_ENABLED:
    _oidc = oidc_settings(
        production=PRODUCTION,
        session_seconds=SWITCHYARD_SSO_SESSION_SECONDS,
        backends=AUTHENTICATION_BACKENDS,
        middleware=MIDDLEWARE,
    )
    # Named here, not only through globals(): registry.auth.sso reads it (and the type checker).
    OIDC_OP_ISSUER: str = _oidc.pop("OIDC_OP_ISSUER")
    globals().update(_oidc)
SWITCHYARD_OIDC_GROUPS_CLAIM = oidc_groups_claim()

# --- Login throttling (django-axes) ------------------------------------------------
# Failed logins are counted per (username, client address) pair, not per username or per
# address alone: locking a username wherever the attempts come from would let anyone lock any
# user out (a denial of service against admins), and locking an address would lock out a whole
# office behind one NAT for one person's typos. The pair stops one source guessing one
# account's password and leaves the real user, from their own address, able to log in.
# Guessing spread over many addresses is not stopped by this; strong passwords stay needed.
AXES_FAILURE_LIMIT = env_int("SWITCHYARD_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("SWITCHYARD_LOGIN_COOLOFF_SECONDS", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True  # a successful login clears that pair's count
AXES_CLIENT_IP_CALLABLE = "stack.login_throttle.client_ip"
AXES_LOCKOUT_CALLABLE = "stack.login_throttle.lockout_response"
# SSO callbacks guess no password (the provider checks it): not counted, never locked out.
AXES_WHITELIST_CALLABLE = "stack.login_throttle.not_a_password_attempt"
# Attempts are rows in the database (axes' default handler), so they roll back with each test.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_VERBOSE = False  # no banner at every process start; lockouts are still logged

# --- Internationalisation and time --------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Static files ----------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"  # collectstatic target, served by WhiteNoise
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- Security -------------------------------------------------------------------------
# How many reverse proxies stand in front of the web app. 0: none, so neither
# X-Forwarded-Proto nor X-Forwarded-For is believed (a client could send either). N > 0:
# the proxies set X-Forwarded-Proto and each appends to X-Forwarded-For.
SWITCHYARD_TRUSTED_PROXIES = env_int("SWITCHYARD_TRUSTED_PROXIES", 0, minimum=0)
if SWITCHYARD_TRUSTED_PROXIES:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if PRODUCTION:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # Load balancers and container health checks ask over plain HTTP from the inside.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    # An hour to start with; raise it (31536000, a year) once HTTPS is known to work, since a
    # browser that saw the header refuses plain HTTP for that long. 0 turns HSTS off.
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
# Error pages and error reports hide connection strings, tokens and keys (stack.error_reports).
DEFAULT_EXCEPTION_REPORTER_FILTER = "stack.error_reports.CredentialHidingFilter"
DEFAULT_EXCEPTION_REPORTER = "stack.error_reports.CredentialHidingReporter"

# --- Broker and Celery -------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    env_url("REDIS_URL", REDIS_URL, schemes=("redis", "rediss"))
# /v1 rate limits (inference.ratelimit.limits): the window that "per minute" means (shorter in tests),
# and where the counters live (REDIS_URL unless set; without either, per process).
RATE_LIMIT_WINDOW_SECONDS = env_float("SWITCHYARD_RATE_LIMIT_WINDOW_SECONDS", 60.0, minimum=1.0)
RATE_LIMIT_REDIS_URL = env_str("SWITCHYARD_RATE_LIMIT_REDIS_URL", REDIS_URL)
if RATE_LIMIT_REDIS_URL:
    env_url("SWITCHYARD_RATE_LIMIT_REDIS_URL", RATE_LIMIT_REDIS_URL, schemes=("redis", "rediss"))
BROKER_DIR = VAR_DIR / "broker"
# (A host part keeps kombu from warning that none was given; the transport ignores it.)
_default_broker = REDIS_URL or "filesystem://localhost/"
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", _default_broker, schemes=("redis", "rediss", "amqp", "filesystem")
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Kombu's filesystem transport: an embedded broker that needs no server,
    # shared by every process on this machine through files under var/.
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
    }
else:
    # Longer than the longest task (training chunks are bounded well below
    # this), so an unacknowledged message is not handed out twice.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=60)
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A lost broker is waited for, however long it is gone (Celery's default gives up after 100
# attempts, about 45 minutes, and the worker exits). redis:// goes through stack/redis_broker.py,
# which keeps a worker holding unacked messages from crashing while it reconnects.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A task that is running when the connection drops finishes (its rows are written once; the
# claims make a redelivery a no-op) instead of being cancelled; its ack is lost with the
# connection. Said explicitly: Celery 6 changes the default.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_IGNORE_RESULT = True  # task outcomes live in our own tables
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Cluster health ---------------------------------------------------------------
HEARTBEAT_SECONDS = env_float("SWITCHYARD_HEARTBEAT_SECONDS", 5.0, minimum=0.1)
DEGRADED_AFTER_SECONDS = env_float("SWITCHYARD_DEGRADED_AFTER_SECONDS", 15.0, minimum=0.1)
DOWN_AFTER_SECONDS = env_float("SWITCHYARD_DOWN_AFTER_SECONDS", 30.0, minimum=0.1)
HEALTH_CHECK_SECONDS = env_float("SWITCHYARD_HEALTH_CHECK_SECONDS", 5.0, minimum=1.0)
if not HEARTBEAT_SECONDS < DEGRADED_AFTER_SECONDS < DOWN_AFTER_SECONDS:
    raise ImproperlyConfigured(
        "Heartbeat timings must satisfy SWITCHYARD_HEARTBEAT_SECONDS < "
        "SWITCHYARD_DEGRADED_AFTER_SECONDS < SWITCHYARD_DOWN_AFTER_SECONDS"
    )

# Periodic work, declared in one place (stack.settings.schedule).
CELERY_BEAT_SCHEDULE = beat_schedule(health_check_seconds=HEALTH_CHECK_SECONDS)
# Admission (inference.admission): a hard budget reserves each call's worst case. An image part
# counts this many input tokens (the most a provider bills one image at its largest detail:
# Anthropic ~1,600, OpenAI's high detail up to ~1,100); a request without max_tokens on a
# deployment without a context window may generate this many output tokens.
INFERENCE_IMAGE_TOKENS = env_int("SWITCHYARD_IMAGE_TOKENS", 1600, minimum=1)
INFERENCE_MAX_OUTPUT_TOKENS = env_int("SWITCHYARD_MAX_OUTPUT_TOKENS", 4096, minimum=1)
# How long a /v1 answer is kept for a retry with the same Idempotency-Key, and only for a
# workflow that keeps prompts (inference.idempotency); other requests keep a hash and the status.
IDEMPOTENCY_REPLAY_SECONDS = env_int("SWITCHYARD_IDEMPOTENCY_REPLAY_SECONDS", 600, minimum=0)
# The router (docs/inference-internals.md "Breaker"): a deployment's circuit opens when
# FAILURE_RATE of its last WINDOW_CALLS calls (no older than WINDOW_SECONDS, at least
# MIN_REQUESTS of them) failed, for COOLDOWN_SECONDS; a request has DEADLINE_SECONDS in all, for
# up to MAX_ROUNDS rounds of its route (jittered backoff from BACKOFF_SECONDS between them); a
# deployment's Retry-After is kept at most MAX_RETRY_AFTER_SECONDS. Variables named as settings.
INFERENCE_BREAKER_FAILURE_RATE = env_float("INFERENCE_BREAKER_FAILURE_RATE", 0.5, minimum=0.0)
if not 0 < INFERENCE_BREAKER_FAILURE_RATE <= 1:
    raise ImproperlyConfigured("INFERENCE_BREAKER_FAILURE_RATE must be above 0 and at most 1")
INFERENCE_BREAKER_MIN_REQUESTS = env_int("INFERENCE_BREAKER_MIN_REQUESTS", 5, minimum=1)
INFERENCE_BREAKER_WINDOW_CALLS = env_int("INFERENCE_BREAKER_WINDOW_CALLS", 20, minimum=1)
INFERENCE_BREAKER_WINDOW_SECONDS = env_float("INFERENCE_BREAKER_WINDOW_SECONDS", 60.0, minimum=0.1)
INFERENCE_BREAKER_COOLDOWN_SECONDS = env_float("INFERENCE_BREAKER_COOLDOWN_SECONDS", 10.0, minimum=0.0)
INFERENCE_DEADLINE_SECONDS = env_float("INFERENCE_DEADLINE_SECONDS", 30.0, minimum=0.1)
INFERENCE_MAX_ROUNDS = env_int("INFERENCE_MAX_ROUNDS", 2, minimum=1)
INFERENCE_BACKOFF_SECONDS = env_float("INFERENCE_BACKOFF_SECONDS", 0.05, minimum=0.0)
INFERENCE_MAX_RETRY_AFTER_SECONDS = env_float("INFERENCE_MAX_RETRY_AFTER_SECONDS", 300.0, minimum=0.0)
# An eval run with no new score for this long (its worker presumably dead) is handed out again.
EVAL_RUN_STALE_SECONDS = env_float("EVAL_RUN_STALE_SECONDS", 1800.0, minimum=1.0)
# A running batch job's lease: longer than one line can take (deadline plus retries).
INFERENCE_BATCH_STALE_SECONDS = env_float("SWITCHYARD_BATCH_STALE_SECONDS", 120.0, minimum=1.0)
INFERENCE_BATCH_PART_LINES = env_int("SWITCHYARD_BATCH_PART_LINES", 20, minimum=1)
# A build-or-buy version evaluation claimed this long ago (its worker presumably dead) is taken
# over by the next delivery or beat's sweep; longer than serving and scoring one version takes.
# A trained model's self-hosted $/1M on the inference pages is also shown with its training cost
# spread over this many months at the volume it serves (billing.selfhosted, billing.amortisation).
SELF_HOSTED_AMORTISE_MONTHS = env_int("SWITCHYARD_AMORTISE_MONTHS", 12, minimum=1)
BUILD_OR_BUY_STALE_SECONDS = env_float("SWITCHYARD_BUILD_OR_BUY_STALE_SECONDS", 900.0, minimum=1.0)

# Ledger chains appended to in parallel: each writer takes whichever partition's head is free
# (billing.services.usage_record_batch), so writers do not queue on one lock. 1 keeps one chain.
LEDGER_PARTITIONS = env_int("SWITCHYARD_LEDGER_PARTITIONS", 4, minimum=1)

# How a routed request is recorded (inference.recording; docs/inference-internals.md "Recording requests"):
# "journal" commits the request row and its journal entry in one INSERT before answering and
# folds the ledger rows in batches right after; "inline" writes everything in the request's
# own transaction. PostgreSQL defaults to the journal, SQLite (the embedded demo) to inline, in
# every SWITCHYARD_ENV: the test suite records as production does, and a test that reads the
# ledger right after a request waits for the fold (tests/helpers.py ledger_settled).
INFERENCE_RECORDING = env_str(
    "SWITCHYARD_INFERENCE_RECORDING",
    "journal" if _db["ENGINE"] != "django.db.backends.sqlite3" else "inline",
)
if INFERENCE_RECORDING not in {"journal", "inline"}:
    raise ImproperlyConfigured(
        f"SWITCHYARD_INFERENCE_RECORDING must be journal or inline; got {INFERENCE_RECORDING!r}"
    )
# A web process's folder thread also looks for entries left by dead processes this often.
INFERENCE_JOURNAL_IDLE_SECONDS = env_float("SWITCHYARD_JOURNAL_IDLE_SECONDS", 2.0, minimum=0.05)
# How long a woken folder waits for more requests before folding them in one transaction.
INFERENCE_JOURNAL_FOLD_DELAY_SECONDS = env_float("SWITCHYARD_JOURNAL_FOLD_DELAY_SECONDS", 0.05, minimum=0.0)

# The largest /v1 request body (long contexts, images as data URLs); over it: a 413 in the
# OpenAI shape. The pages and /api keep Django's DATA_UPLOAD_MAX_MEMORY_SIZE.
V1_MAX_BODY_BYTES = env_int("SWITCHYARD_V1_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024)
# The largest upload to /v1/files (a batch's JSONL; OpenAI's own limit for batch input is
# 200 MB). Spooled to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE, never held whole.
V1_MAX_FILE_BYTES = env_int("SWITCHYARD_V1_MAX_FILE_BYTES", 200 * 1024 * 1024, minimum=1024)

# --- Metrics and traces (stack.metrics, registry.tracing) ---------------------------
# The router's counters and histograms (inference.metrics); off only to measure what they cost.
METRICS_ENABLED = env_bool("SWITCHYARD_METRICS", True)
# Who may scrape /metrics: a bearer holding the token (compared in constant time), from the
# client networks when they are set. Without a token nobody may, unless METRICS_ALLOW_LOOPBACK
# lets loopback in without one (off by default: behind a proxy on the same host that is not in
# SWITCHYARD_TRUSTED_PROXIES every client looks like loopback).
METRICS_TOKEN = env_str("SWITCHYARD_METRICS_TOKEN", "")
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("SWITCHYARD_METRICS_TOKEN must be at least 16 characters")
METRICS_ALLOW_NETWORKS = env_networks("SWITCHYARD_METRICS_ALLOW_NETWORKS")
METRICS_ALLOW_LOOPBACK = env_bool("SWITCHYARD_METRICS_ALLOW_LOOPBACK", False)
# How long a scrape reuses the values read from the database and Redis (spend, budgets,
# breakers, queues, heartbeats, training): several Prometheus servers or a short scrape
# interval then cost one read per this many seconds.
METRICS_CACHE_SECONDS = env_float("SWITCHYARD_METRICS_CACHE_SECONDS", 5.0, minimum=0.0)

# --- Alerts (billing.alerts) -------------------------------------------------------
# Where links in Slack, Teams and webhook alerts point (e.g. https://switchyard.example.com);
# empty: alerts carry no link.
SWITCHYARD_PUBLIC_URL = env_str("SWITCHYARD_PUBLIC_URL", "")
# A spend anomaly must exceed its baseline median by at least this much per day (in the ledger's
# currency), so a target that spends cents is not called anomalous for a few more cents.
ANOMALY_MIN_AMOUNT = env_decimal("SWITCHYARD_ANOMALY_MIN_AMOUNT", "1.00", minimum=Decimal(0))
if not 0 <= env_int("SWITCHYARD_DIGEST_HOUR_UTC", 0) <= 23:
    raise ImproperlyConfigured("SWITCHYARD_DIGEST_HOUR_UTC must be an hour of the day, 0 to 23")

# --- Email (budget alerts) --------------------------------------------------------
# The console backend prints mail in development; point EMAIL_BACKEND at
# django.core.mail.backends.smtp.EmailBackend (and EMAIL_HOST...) in production.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "switchyard@localhost")

# --- Object store -----------------------------------------------------------------
OBJECT_STORE_URL = env_url("OBJECT_STORE_URL", f"file://{VAR_DIR / 'objects'}", schemes=("file", "s3"))
OBJECT_STORE_ENDPOINT_URL = env_str("OBJECT_STORE_ENDPOINT_URL", "") or None
# S3 part size and concurrency (SWITCHYARD_OBJECT_STORE_PART_BYTES / _CONCURRENCY): parsed by the
# storage library, which learner processes use without Django; parsed here too so that a bad
# value stops every Django process at start, and handed to the stores opened from settings.
try:
    OBJECT_STORE_TRANSFER = transfer_from_env()
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None

# A cluster's own store (Cluster.object_store_url) on file:// must lie under this directory: the
# workers write checkpoints there with their own file access, so an operator names a place
# inside it, never any path of the machine. s3:// stores are reached through the outbound guard.
CLUSTER_STORE_FILE_ROOT = Path(env_str("SWITCHYARD_CLUSTER_STORE_FILE_ROOT", str(VAR_DIR / "cluster-stores")))
# Placement weighs moving a learner's checkpoint to another cluster's store (its egress, paid
# once) against this many hours of the clusters' accelerator prices.
PLACEMENT_EGRESS_HORIZON_HOURS = env_decimal(
    "SWITCHYARD_PLACEMENT_EGRESS_HORIZON_HOURS", "1", minimum=Decimal("0")
)

# --- Outbound requests and data sources (registry/outbound/guard.py, training/run_config/) ---
# Networks every outbound request may reach although they are loopback, private or link-local
# (an internal webhook receiver); providers allow private networks one by one, on their record.
OUTBOUND_ALLOW_NETWORKS = env_networks("SWITCHYARD_OUTBOUND_ALLOW_NETWORKS")
# How long a host's checked addresses are reused before it is resolved again.
OUTBOUND_DNS_CACHE_SECONDS = env_float("SWITCHYARD_OUTBOUND_DNS_CACHE_SECONDS", 30.0, minimum=0.0)
# Where training runs may read data from (besides the built-in stdlib:// corpus).
TRAINING_DATA_ROOTS = env_data_roots("SWITCHYARD_TRAINING_DATA_ROOTS")

# --- REST API ---------------------------------------------------------------------
# The audit trail (registry.audit): django-auditlog writes AuditEntry rows, diffs as JSON values.
AUDITLOG_LOGENTRY_MODEL = "audit.AuditEntry"
AUDITLOG_STORE_JSON_CHANGES = True

# The API's classes and its OpenAPI schema (stack.settings.api).
REST_FRAMEWORK = rest_framework_settings()
SPECTACULAR_SETTINGS = spectacular_settings()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # axes logs every login at INFO; failed logins and lockouts are WARNING and stay.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}
