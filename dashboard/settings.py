"""Django settings: every value can come from the environment; defaults run a local dashboard."""

import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from dashboard.env import env_bool, env_float, env_int, env_list, env_str
from dashboard.paths import INSTALLED, SOURCE_DIR, home_default

BASE_DIR = Path(__file__).resolve().parent.parent
# Everything a running dashboard writes (database, datasets, checkpoints) lives under one folder:
# a clone's var/, an installed wheel's folder in the user's data folder (dashboard/paths.py).
VAR_DIR = Path(env_str("TRAINYARD_HOME", str(home_default())))

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

# Off unless asked for: a debug page shows settings (the Redis URL with its password) and
# tracebacks to whoever makes a request fail. `make run` and the tests ask for the local
# dashboard's defaults with TRAINYARD_DEBUG=1: debug pages, a development key, local host names,
# plain HTTP.
DEBUG = env_bool("TRAINYARD_DEBUG", False)
_LOCAL_HINT = "(or TRAINYARD_DEBUG=1 for a local dashboard)"
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(f"SECRET_KEY must be set when DEBUG is off {_LOCAL_HINT}")
    SECRET_KEY = "insecure-dev-key-only-for-debug-mode"  # noqa: S105
if not DEBUG and not env_str("ALLOWED_HOSTS", ""):
    # The local defaults below would serve production under any name it is reached by.
    raise ImproperlyConfigured(
        f"ALLOWED_HOSTS must be set when DEBUG is off (e.g. example.com) {_LOCAL_HINT}"
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # first, so that runserver is the ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # its templates and static files: the API docs page with no CDN
    "dashboard",
    "dashboard.accounts",
    "dashboard.experiments",
    "dashboard.devices",
    "dashboard.notifications",
    "dashboard.studies",
]

MIDDLEWARE = [
    # Outermost, so that it sees every answer under /api/, the other middleware's refusals too.
    "dashboard.api.api_answers_json",
    "django.middleware.security.SecurityMiddleware",
    # Before any view filters the database with a query parameter no column can hold (inside
    # SecurityMiddleware, so that its 400 has the security headers too).
    "dashboard.text_input.query_text_guard",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    # A login page's or the admin's POST past the login limits: the 429 page.
    "dashboard.accounts.throttles.LoginThrottledPage",
]

ROOT_URLCONF = "dashboard.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SOURCE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
ASGI_APPLICATION = "dashboard.asgi.application"


# Per-session server settings (libpq's "options"): probe an idle client after 10 s, drop it after
# two unanswered probes or 10 s of unacknowledged data.
SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=2 "
    "-c tcp_user_timeout=10000"
)


def database_settings(url: str) -> dict[str, Any]:
    """Django's settings for the database at `url` (DATABASE_URL's form); the tests' PostgreSQL
    pass (tests/conftest.py) builds its settings here too, so it runs what production runs."""
    database: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if database["ENGINE"] == "django.db.backends.sqlite3":
        # The web server and the workers write one file at once: WAL plus a busy timeout, and
        # IMMEDIATE transactions so that writers queue instead of failing with "database is
        # locked".
        database["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        database["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    elif database["ENGINE"] == "django.db.backends.postgresql":
        # A worker whose machine drops off the network must see its queries fail within
        # seconds, not after TCP's ~15 minutes of retries: its supervisor then ends its part of
        # a multi-node run (runner.py), which the other machines have given up by then.
        url_options = database.get("OPTIONS", {})
        database["OPTIONS"] = {
            "connect_timeout": 10,
            "tcp_user_timeout": 10000,  # ms unacknowledged before the connection is dropped
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 2,
            # What the URL itself asks for (?sslmode=require, sslrootcert, ...) wins.
            **url_options,
        }
        if env_bool("TRAINYARD_POSTGRES_SERVER_KEEPALIVES", True):
            # The same bounds on the server's end of the session: a worker cut off inside a
            # transaction (update_or_create, a claim's row locks) would otherwise keep its locks
            # there for TCP's two hours, and every claim would queue behind them. Off behind a
            # pooler that refuses startup options (its own timeouts then do this).
            options = f"{SERVER_KEEPALIVES} {url_options.get('options', '')}"
            database["OPTIONS"]["options"] = options.strip()
    return database


DATABASES = {
    "default": database_settings(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'trainyard.sqlite3'}")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A training task runs for minutes to days: one at a time per pool slot, nothing hoarded.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "experiment-list"
LOGOUT_REDIRECT_URL = "login"

# The throttle first: it lets no one in itself, it refuses a login past its limits (429)
# before the password is checked (accounts/throttles.py). Sessions keep naming ModelBackend.
AUTHENTICATION_BACKENDS = [
    "dashboard.accounts.throttles.LoginThrottle",
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# collectstatic's target (whitenoise serves from the finders without it): never site-packages.
STATIC_ROOT = (VAR_DIR if INSTALLED else BASE_DIR) / "staticfiles"
# uPlot is vendored in static/vendor/uplot/ (its README: version, licence): no Node, no build step.
STATICFILES_DIRS = [SOURCE_DIR / "static"]
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Bad input: bodies over 64 KiB are refused (413 from the JSON API, the same figure as
# dashboard.api.MAX_BODY_BYTES), and so are WebSocket frames over 64 KiB under
# `manage.py runserver` (the Procfile passes the same to daphne; the consumer closes at 4 KiB).
# The message limit also bounds what daphne sends, so it holds a long run's snapshot (Procfile).
DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
DAPHNE_WEBSOCKET_MAX_FRAME_SIZE = 64 * 1024

# Per-user limits on launches (0 turns one off): runs queued or running at once, and launches
# in any minute. Over either, the API answers 429 with Retry-After and the form says why.
TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = env_int("TRAINYARD_MAX_ACTIVE_RUNS_PER_USER", 4)
TRAINYARD_LAUNCH_RATE_PER_MINUTE = env_int("TRAINYARD_LAUNCH_RATE_PER_MINUTE", 10)
# Runs one user may have queued or running, however launched (a study asks for room for all of
# its runs up front and is refused whole, 409, where they do not fit): the queue's bound. Above
# a study's 48 runs, so that the largest study fits beside a few runs of the user's own.
TRAINYARD_MAX_QUEUED_RUNS_PER_USER = env_int("TRAINYARD_MAX_QUEUED_RUNS_PER_USER", 64)
# Tokens made through POST /api/tokens/ per user in any minute (0: no limit), the same way.
TRAINYARD_TOKEN_RATE_PER_MINUTE = env_int("TRAINYARD_TOKEN_RATE_PER_MINUTE", 10)
# An open WebSocket checks the login it was opened with this often (a token past its expiry, a
# change made without a signal); a logout, a password change, a deactivation or a loss of staff
# tell the user's sockets at once.
TRAINYARD_SOCKET_RECHECK_SECONDS = env_float("TRAINYARD_SOCKET_RECHECK_SECONDS", 60.0)
# Password guessing (the login page, the admin's, POST /api/tokens/): failed logins in the last
# TRAINYARD_LOGIN_WINDOW_SECONDS, per username tried and per client address (0: no limit). At
# the limit, the next try is answered 429 with Retry-After until the oldest failure is out of
# the window, whatever its password; a login that succeeds counts for nothing.
TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = env_int("TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT", 5)
TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = env_int("TRAINYARD_LOGIN_FAILURES_PER_ADDRESS", 20)
TRAINYARD_LOGIN_WINDOW_SECONDS = env_int("TRAINYARD_LOGIN_WINDOW_SECONDS", 15 * 60)
# Imports (POST /api/experiments/import/) a user may send in any hour, refused ones too: each
# is read and parsed by the web server (0: no limit).
TRAINYARD_IMPORT_RATE_PER_HOUR = env_int("TRAINYARD_IMPORT_RATE_PER_HOUR", 30)

if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Trainyard itself.
TRAINYARD_DATA_DIR = Path(env_str("TRAINYARD_DATA_DIR", str(VAR_DIR / "data")))
TRAINYARD_RUNS_DIR = Path(env_str("TRAINYARD_RUNS_DIR", str(VAR_DIR / "runs")))
# Uploaded code, an archive per content hash (POST /api/code/): shared with the workers as
# TRAINYARD_RUNS_DIR is, where runs span machines.
TRAINYARD_CODE_DIR = Path(env_str("TRAINYARD_CODE_DIR", str(VAR_DIR / "code")))
# Folders on the workers whose code a script run may name as its `code_path` (and the folders
# under them), separated by os.pathsep ("/srv/code:/home/shared"). Empty, the default: none, so
# a script run's code is an upload. A worker checks its own setting before it starts one.
TRAINYARD_SCRIPT_ROOTS = [
    Path(root) for root in env_str("TRAINYARD_SCRIPT_ROOTS", "").split(os.pathsep) if root
]
# After a Stop, the seconds a script run's ranks get to agree, save a checkpoint and leave
# before they are killed (the launcher's --stop-grace): a save takes longer than our engine's.
TRAINYARD_SCRIPT_STOP_SECONDS = env_int("TRAINYARD_SCRIPT_STOP_SECONDS", 60)
# A worker that has not reported for this long no longer counts as available capacity.
TRAINYARD_WORKER_STALE_SECONDS = env_int("TRAINYARD_WORKER_STALE_SECONDS", 60)
TRAINYARD_DEVICE_REPORT_SECONDS = env_int("TRAINYARD_DEVICE_REPORT_SECONDS", 5)
# Seconds between SIGTERM and SIGKILL when a run is stopped.
TRAINYARD_STOP_GRACE_SECONDS = env_int("TRAINYARD_STOP_GRACE_SECONDS", 3)
# How long a run's processes may tear down after `finished` (evaluated and checkpointed) before
# the supervisor ends them: a process group's teardown can hang (NCCL's, Gloo's across machines).
TRAINYARD_TEARDOWN_SECONDS = env_float("TRAINYARD_TEARDOWN_SECONDS", 15.0)
# Profiles on request: the newest this many of a run are kept (older ones' files deleted), and
# a rank's trace file over this many bytes (gzipped) is deleted as it comes, its summary kept.
TRAINYARD_PROFILES_KEPT = env_int("TRAINYARD_PROFILES_KEPT", 3)
TRAINYARD_PROFILE_MAX_BYTES = env_int("TRAINYARD_PROFILE_MAX_BYTES", 64 * 1024 * 1024)
# A running run whose supervisor has been silent this long is `lost`, and queued again to resume
# from its last checkpoint until it has been attempted this many times.
TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS = env_float("TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS", 30.0)
TRAINYARD_MAX_ATTEMPTS = env_int("TRAINYARD_MAX_ATTEMPTS", 3)
TRAINYARD_REAPER_SECONDS = env_float("TRAINYARD_REAPER_SECONDS", 10.0)
# A run reported from outside (a script elsewhere posting its events) that has not posted for
# this long: its page says so, and a Stop ends it at once (no script is there to hear it).
# Its client posts at least every few seconds while it lives, so a minute is a real silence.
TRAINYARD_REPORTED_SILENT_SECONDS = env_int("TRAINYARD_REPORTED_SILENT_SECONDS", 60)
# A queued run never tried for this long is sent to the workers again; a run whose turn it is,
# not tried for this long, is woken again (the net under the wake-ups: runs/parked.py).
TRAINYARD_REDISPATCH_SECONDS = env_int("TRAINYARD_REDISPATCH_SECONDS", 60)

# Slurm as an execution backend (scheduling/slurm/, runs/slurm/; README "Slurm"): a run with
# backend "slurm" is one batch job, which the cluster's scheduler orders and places. The Slurm
# commands are on this machine's PATH (the web server's and beat's), or run on a login node over
# ssh (TRAINYARD_SLURM_SSH=user@login-node). The partition a job asks for unless its run names
# one (empty: the cluster's default), and more sbatch options (shell words, e.g. "--qos=normal
# --account=ml"). A job is sent SIGUSR1 this many seconds before its time limit: its run writes
# a checkpoint and is requeued. The reconciler reads squeue this often (beat). The QoS every job
# asks for (empty: the account's default); a run's priority goes as its --nice (slurm/jobs.py).
TRAINYARD_SLURM = env_bool("TRAINYARD_SLURM", False)
TRAINYARD_SLURM_SSH = env_str("TRAINYARD_SLURM_SSH", "")
TRAINYARD_SLURM_PARTITION = env_str("TRAINYARD_SLURM_PARTITION", "")
TRAINYARD_SLURM_SBATCH_ARGS = env_str("TRAINYARD_SLURM_SBATCH_ARGS", "")
TRAINYARD_SLURM_QOS = env_str("TRAINYARD_SLURM_QOS", "")
TRAINYARD_SLURM_SIGNAL_SECONDS = env_int("TRAINYARD_SLURM_SIGNAL_SECONDS", 120)
TRAINYARD_SLURM_RECONCILE_SECONDS = env_float("TRAINYARD_SLURM_RECONCILE_SECONDS", 15.0)

# Kubernetes on paper (scheduling/kubernetes/, docs/guides/kubernetes.md): what `manage.py
# k8s_manifest <id>` writes into a run's Kubeflow Trainer TrainJob. The image holds this checkout
# (its WORKDIR) and its environment; the namespace; the Kueue LocalQueue (empty: no queue label);
# the Trainer runtime; the Secret the supervisor's DATABASE_URL, REDIS_URL and SECRET_KEY come
# from; the volume claim mounted at TRAINYARD_RUNS_DIR and TRAINYARD_DATA_DIR (runs/, data/).
TRAINYARD_K8S_IMAGE = env_str("TRAINYARD_K8S_IMAGE", "trainyard:latest")
TRAINYARD_K8S_NAMESPACE = env_str("TRAINYARD_K8S_NAMESPACE", "default")
TRAINYARD_K8S_QUEUE = env_str("TRAINYARD_K8S_QUEUE", "")
TRAINYARD_K8S_RUNTIME = env_str("TRAINYARD_K8S_RUNTIME", "torch-distributed")
TRAINYARD_K8S_SECRET = env_str("TRAINYARD_K8S_SECRET", "trainyard")
TRAINYARD_K8S_CLAIM = env_str("TRAINYARD_K8S_CLAIM", "trainyard")

# Notifications when a run ends (each user opts in on the Notifications page). Mail goes to the
# console unless EMAIL_BACKEND says otherwise, e.g. django.core.mail.backends.smtp.EmailBackend
# with EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD and EMAIL_USE_TLS.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "trainyard@localhost")
# The address people reach the dashboard at, for the link in a notification.
TRAINYARD_PUBLIC_URL = env_str("TRAINYARD_PUBLIC_URL", "http://127.0.0.1:8000")
# A webhook or mail that fails is tried again after base, 2 x base, 4 x base ... seconds.
TRAINYARD_NOTIFY_MAX_RETRIES = env_int("TRAINYARD_NOTIFY_MAX_RETRIES", 5)
TRAINYARD_NOTIFY_BACKOFF_SECONDS = env_float("TRAINYARD_NOTIFY_BACKOFF_SECONDS", 10.0)
# A delivery still pending (or sending) this long after its last try lost its retry with a
# restarted worker: the sweep queues it again. Longer than the longest backoff (160 s by default).
TRAINYARD_NOTIFY_STALE_SECONDS = env_int("TRAINYARD_NOTIFY_STALE_SECONDS", 600)
# How long the link that verifies a notification address works (notifications/verification.py):
# mail goes only to a verified address.
TRAINYARD_EMAIL_VERIFY_SECONDS = env_int("TRAINYARD_EMAIL_VERIFY_SECONDS", 3 * 24 * 3600)
# Webhooks to private, loopback and link-local addresses are refused (SSRF) unless this is on.
TRAINYARD_WEBHOOK_ALLOW_PRIVATE = env_bool("TRAINYARD_WEBHOOK_ALLOW_PRIVATE", False)

CELERY_BEAT_SCHEDULE = {
    "reap-lost-runs": {
        "task": "experiments.reap_lost_runs",
        "schedule": TRAINYARD_REAPER_SECONDS,
    },
    # Announcements lost with a broker or a worker (see notifications.tasks) go out again.
    "sweep-notifications": {
        "task": "notifications.notifications_sweep",
        "schedule": 60.0,
    },
}
if TRAINYARD_SLURM:  # the Slurm jobs' states, mirrored (runs/slurm/reconcile.py)
    CELERY_BEAT_SCHEDULE["slurm-reconcile"] = {
        "task": "experiments.slurm_reconcile",
        "schedule": TRAINYARD_SLURM_RECONCILE_SECONDS,
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

VAR_DIR.mkdir(parents=True, exist_ok=True)
