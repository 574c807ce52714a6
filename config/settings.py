"""Env-driven Django settings (django-environ); defaults give the zero-setup embedded demo (SQLite)."""

from datetime import timedelta
from pathlib import Path

import environ
from csp.constants import NONCE
from django.core.exceptions import ImproperlyConfigured

from config.auth_settings import sign_in_settings
from config.secret_key import DEMO_SECRET_KEY

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"  # runtime files of the embedded mode (SQLite database, agent spools)

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
# The default key is only fit for the local demo (DEBUG=1): with DEBUG=0, gunicorn, Celery's worker and
# beat refuse to start on it, on .env.example's placeholder or on an empty key, and `manage.py check
# --deploy` fails (config/secret_key.py, which also registers that check).
SECRET_KEY = env("SECRET_KEY", default=DEMO_SECRET_KEY)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# HTTPS and the browser's protections (docs/security.md). The deployment defaults (docker-compose.yml)
# turn the cookie flags and HSTS on, for a TLS-terminating proxy in front; the embedded demo serves
# plain http on 127.0.0.1, where a Secure cookie would never come back (no login), so they default off.
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
# Sent only on requests that arrived over HTTPS (Django's SecurityMiddleware); 0: no header.
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# Behind a proxy that terminates TLS: the header it sets, "HTTP_X_FORWARDED_PROTO,https" (Django's
# SECURE_PROXY_SSL_HEADER; trust it only when every request comes through that proxy).
_proxy_ssl_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header) if len(_proxy_ssl_header) == 2 else None
# http -> https redirects belong to the proxy; this one would also redirect the container's health check.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
# Content-Security-Policy (django-csp): on unless DEBUG (the embedded demo); ATTUNE_CSP=off|report-only.
# Scripts only from this site (the pages have no inline script; a template that needs one takes the
# response's nonce, request.csp_nonce). Styles also inline: Plotly injects its stylesheet and sets
# style attributes, the admin's change list has a <style>, and Swagger UI's page one.
ATTUNE_CSP = env("ATTUNE_CSP", default="off" if DEBUG else "on")
if ATTUNE_CSP not in ("on", "off", "report-only"):
    raise ImproperlyConfigured(f"ATTUNE_CSP is on, off or report-only, not {ATTUNE_CSP!r}")
_csp = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", NONCE],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
CONTENT_SECURITY_POLICY = _csp if ATTUNE_CSP == "on" else None
CONTENT_SECURITY_POLICY_REPORT_ONLY = _csp if ATTUNE_CSP == "report-only" else None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "cluster_app",
    "profiles_app",
    "scheduler_app",
    "notify_app",
    "axes",
    "csp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The Content-Security-Policy header (CONTENT_SECURITY_POLICY above), with a nonce per response that
    # uses one; built once for the others (config/csp_middleware.py).
    "config.csp_middleware.PolicyOnceCSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login that axes refused into the lockout answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

# DATABASE_URL unset = the embedded demo database; CI and production point it at PostgreSQL.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'attune.sqlite3'}")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The embedded demo has the web server, rounds and agents' reports writing at once: wait for the
    # write lock instead of failing, and take it at the start of each transaction (no upgrade deadlock).
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
# Persistent connections by default: a sync call is a few milliseconds of work, and opening a PostgreSQL
# connection costs as much again (config/asgi.py keeps its threads, so their connections live on).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=300)
# With persistent connections, check a reused one before a request uses it (a restarted PostgreSQL).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = DATABASES["default"]["CONN_MAX_AGE"] > 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# LDAP and OpenID Connect sign-in, off unless configured (config/auth_settings.py, docs/auth.md); local
# passwords stay.
_sign_in = sign_in_settings(env)
globals().update(_sign_in)
# The user pages' own login (the admin's refuses non-staff users).
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:queue"
LOGOUT_REDIRECT_URL = "web:login"
# Failed logins (django-axes): the login form, the admin's and POST /api/v1/auth/token/ all authenticate
# through AxesStandaloneBackend, which counts failures per username and client address together (a wrong
# password from one address never locks the owner out elsewhere). At the limit that pair is refused with a
# 429 saying when to retry (scheduler_app/web/lockout.py) until the cool-off has passed since its last
# failure; a successful login clears the count. ATTUNE_LOGIN_THROTTLE=0 turns it off.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    *_sign_in["ATTUNE_SIGN_IN_BACKENDS"],  # LDAP, OpenID Connect when configured: axes counts theirs too
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env.bool("ATTUNE_LOGIN_THROTTLE", default=True)
AXES_FAILURE_LIMIT = env.int("ATTUNE_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(seconds=env.float("ATTUNE_LOGIN_COOLOFF_S", default=900.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "scheduler_app.web.lockout.lockout_response"
# Failures are kept (until their cool-off ends); one row per successful login would only grow.
AXES_DISABLE_ACCESS_LOG = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Serve straight from the app/static folders too, so the demo and tests need no collectstatic.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production (docker-compose) sets the compressed manifest storage after collectstatic.
    "staticfiles": {
        "BACKEND": env("STATICFILES_BACKEND", default="django.contrib.staticfiles.storage.StaticFilesStorage")
    },
}

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Django's cache holds the dashboards' closed usage buckets (scheduler_app/dashboards/bucket_cache.py).
# Local memory (one copy per process) for the embedded demo; a Redis database of its own in production
# and CI, so every web worker shares it. Not the broker's database: clearing the cache flushes it.
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}
if CACHES["default"]["BACKEND"].endswith(".RedisCache"):
    # One pool per process, not one per request (config/redis_pool.py says why).
    CACHES["default"].setdefault("OPTIONS", {})["pool_class"] = "config.redis_pool.SharedConnectionPool"
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", default=REDIS_URL)
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-task leaves it for another worker
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Forecasts (the refresh after rounds, admission forecasts finished by a worker, what-if simulations)
# run seconds to minutes each: on a queue of their own, served by a worker of their own
# (`celery worker -Q forecasts`), so that they never hold up rounds, liveness sweeps and profiling
# dispatch on the default queue (`celery`, what a worker without -Q consumes).
CELERY_TASK_ROUTES = {
    "scheduler_app.tasks.forecast_refresh_task": {"queue": "forecasts"},
    "scheduler_app.tasks.admission_forecast_task": {"queue": "forecasts"},
    "scheduler_app.tasks.simulation_run_task": {"queue": "forecasts"},
}
CELERY_TIMEZONE = TIME_ZONE

REST_FRAMEWORK = {
    # Users: `Authorization: Token <key>` or a browser session; agent endpoints set their own Bearer
    # class. Token first: its challenge makes a missing or bad credential a 401 with
    # `WWW-Authenticate: Token` (session authentication has no challenge, so DRF would answer 403).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["scheduler_app.api.filter_backends.StrictFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "scheduler_app.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    # Bodies too large (413) or nested too deeply (400) are refused before they are parsed.
    "DEFAULT_PARSER_CLASSES": [
        "scheduler_app.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Attune API",
    "DESCRIPTION": "Scheduling service for shared GPU clusters (Synergy + GENIE).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and Redoc assets come from drf-spectacular-sidecar, served locally (no CDN).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Clients send JSON: the schema documents that body type only. Users' endpoints also parse forms
    # (the browsable API posts them), strictly, but a form cannot say null, a list or an object, so it
    # is a convenience, not part of the contract.
    "PARSER_WHITELIST": ["scheduler_app.api.parsers.BoundedJSONParser"],
    # Every operation documents the errors it can answer (400, 401 with its challenge, 403, 404, 413).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "scheduler_app.api.schema.add_error_responses",
        "scheduler_app.api.schema.express_submission_variants",
        "scheduler_app.api.schema.express_string_rules",
    ],
}

# Every scheduler knob lives here and is read only by scheduler_app/conf.py.
ATTUNE_SCHEDULER = {
    # swaf + genie: within 5 % of the best specialised scheduler on both papers' benchmarks, with restart
    # costs too, jobs without a deadline aged (no starvation) (docs/reproduction.md, "One default for
    # both papers"). ATTUNE_POLICY=fifo ATTUNE_ALLOCATOR=tune: the default before, FIFO with Synergy's tune.
    "policy": env("ATTUNE_POLICY", default="swaf"),
    "allocator": env("ATTUNE_ALLOCATOR", default="genie"),
    "round_s": env.int("ATTUNE_ROUND_S", default=60),
    # A submission or a job's end asks for an early round this many seconds later (debounced).
    "early_round_delay_s": env.float("ATTUNE_EARLY_ROUND_DELAY_S", default=2.0),
    # After a round of d seconds (workers' mode) the next early round waits until this x d after its
    # end: under churn (a job ending every second) early rounds would otherwise run back to back, and
    # on a small host every second the rounds take is CPU the agents' syncs wait for. 2: at most a
    # third of the time; a 50 ms round still leaves the next one to the 2 s debounce above.
    "round_pacing": env.float("ATTUNE_ROUND_PACING", default=2.0),
    # Run early rounds inline after commit instead of through Celery: the embedded mode (no
    # DATABASE_URL, so no worker) and eager Celery. Beat rounds always need Celery beat.
    "inline_rounds": env.bool("ATTUNE_INLINE_ROUNDS", default=not env.str("DATABASE_URL", default="")),
    # Workers' mode: a sync stores its progress reports (acknowledging them) and a worker applies every
    # server's in one transaction this often, instead of each sync locking its jobs to apply its own:
    # at a thousand agents that was the largest part of a sync's CPU. 0: each sync applies its own.
    # Log lines go with progress; starts and exits are always applied within their sync. Inline mode:
    # always 0 (no worker).
    "progress_apply_s": env.float("ATTUNE_PROGRESS_APPLY_S", default=2.0),
    "preempt_grace_s": env.int("ATTUNE_PREEMPT_GRACE_S", default=30),
    "cancel_grace_s": env.int("ATTUNE_CANCEL_GRACE_S", default=10),
    "log_tail_lines": env.int("ATTUNE_LOG_TAIL_LINES", default=500),
    "agent_report_retention_days": env.int("ATTUNE_AGENT_REPORT_RETENTION_DAYS", default=7),
    # Per-job decisions of each round (1,000 jobs x 1,440 rounds a day add up); rounds themselves stay.
    "round_decision_retention_days": env.int("ATTUNE_ROUND_DECISION_RETENTION_DAYS", default=7),
    # Admission: refuse a submission whose QoS target the forecast says cannot be met (else accept
    # it and say so). The forecast looks this far ahead, with this much computing at submission (a
    # short queue, no worker, or a QoS target that may refuse); past a short queue the forecasts
    # worker answers: it plays the running jobs and the first `forecast_window_jobs` pending ones,
    # waited for by the submission's answer at most `admission_answer_wait_s`.
    "reject_unattainable_qos": env.bool("ATTUNE_REJECT_UNATTAINABLE_QOS", default=False),
    "forecast_horizon_h": env.float("ATTUNE_FORECAST_HORIZON_H", default=168.0),
    "forecast_time_budget_s": env.float("ATTUNE_FORECAST_TIME_BUDGET_S", default=2.0),
    "forecast_window_jobs": env.int("ATTUNE_FORECAST_WINDOW_JOBS", default=1000),
    "admission_in_request_max_jobs": env.int("ATTUNE_ADMISSION_IN_REQUEST_MAX_JOBS", default=0),
    "admission_answer_wait_s": env.float("ATTUNE_ADMISSION_ANSWER_WAIT_S", default=0.5),
    "admission_forecast_min_interval_s": env.float("ATTUNE_ADMISSION_FORECAST_MIN_INTERVAL_S", default=0.25),
    # After a round every live job is re-forecast (the times the pages show) within this budget, by a
    # task on the `forecasts` queue (services/forecast_refresh.py), started at most once per interval.
    # Twice the budget: in a burst of rounds (one every ~2 s) refreshes that spend all of it take about
    # half of one forecasts worker process, never a whole core of a small host, and leave it to the
    # admission forecasts and what-ifs it also serves; the times shown lag the last round by at most the
    # interval plus one refresh, little against a 60 s round. After a quiet spell a round is forecast at once.
    "forecast_refresh_budget_s": env.float("ATTUNE_FORECAST_REFRESH_BUDGET_S", default=5.0),
    # With a worker the refresh is played in tasks (parts) of this much CPU each (process time): a
    # part stops before a round that, costing what the costliest of the last few did, would overrun
    # it, and the forecast goes on in the next part, paced as above (services/forecast_cycle.py).
    # 0.4: at 4,000 GPUs a round takes up to 0.6 s, more on a loaded host, and a part that meets one
    # stays under 1 s (0.5 reached 0.93 s at load 6 to 9; docs/performance.md). The budget above
    # bounds the inline refresh (no worker) and the worker's admission forecast.
    "forecast_refresh_cpu_s": env.float("ATTUNE_FORECAST_REFRESH_CPU_S", default=0.4),
    # And the parts together at most this much CPU per round interval (`round_s`, windows on the clock),
    # as Slurm's backfill bounds its pass over a deep queue and resumes it: a cycle that costs more
    # goes on in the next intervals (at 10,000 live jobs on 4,000 GPUs 22 to 24 rounds, the estimates
    # as old); a cycle that costs less still runs once a round. 0: unbounded.
    "forecast_refresh_cpu_per_round_s": env.float("ATTUNE_FORECAST_REFRESH_CPU_PER_ROUND_S", default=1.0),
    "forecast_refresh_min_interval_s": env.float("ATTUNE_FORECAST_REFRESH_MIN_INTERVAL_S", default=10.0),
    # And the next refresh waits this x the last one's duration after its end: a refresh slowed by a
    # loaded host (a thousand nodes under churn) spaces the next ones out instead of taking the CPU the
    # syncs and rounds need; at most a fifth of the time with 4.
    "forecast_refresh_pacing": env.float("ATTUNE_FORECAST_REFRESH_PACING", default=4.0),
    # Every user sees every job's summary in the queue (squeue); true: only their own (PrivateData=jobs).
    "private_jobs": env.bool("ATTUNE_PRIVATE_JOBS", default=False),
    # ATTUNE_POLICY=swaf (sjf, srtf): a job without a QoS target that has waited longer than
    # max(factor x its remaining execution time, floor) goes ahead of the shortest-first tails and
    # starts at the next round (docs/genie.md, "Policies": Aging); a maximum wait caps that (0: none);
    # factor 0: no aging, shortest first without a bound.
    "aging_factor": env.float("ATTUNE_AGING_FACTOR", default=4.0),
    "aging_floor_h": env.float("ATTUNE_AGING_FLOOR_H", default=1.0),
    "aging_max_wait_h": env.float("ATTUNE_AGING_MAX_WAIT_H", default=0.0),
    # ATTUNE_POLICY=fairshare: a user's past GPU-seconds count half after this many hours.
    "fairshare_half_life_h": env.float("ATTUNE_FAIRSHARE_HALF_LIFE_H", default=168.0),
    # MASTER_PORT of multi-node jobs' rendezvous, chosen per placement in this range (torchrun: 29500).
    "rendezvous_port_min": env.int("ATTUNE_RENDEZVOUS_PORT_MIN", default=29500),
    "rendezvous_port_max": env.int("ATTUNE_RENDEZVOUS_PORT_MAX", default=30499),
    # A submission's Idempotency-Key answers its retries this long (then the hourly task deletes it).
    "idempotency_key_ttl_h": env.float("ATTUNE_IDEMPOTENCY_KEY_TTL_H", default=24.0),
    # Restarts (docs/restarts.md): every move or preemption of a running job costs its start-up and the
    # work since its last checkpoint, so rounds keep running jobs in place unless a change pays for its
    # restarts by this margin over this horizon, never move a job within the minimum run time (Slurm's
    # PreemptExemptTime) except for what must not wait, and run jobs that fit on one server on one.
    # false: re-decide every job freely each round, as the papers' simulators do.
    "restart_costs": env.bool("ATTUNE_RESTART_COSTS", default=True),
    "min_run_s": env.float("ATTUNE_MIN_RUN_S", default=300.0),
    "move_horizon_s": env.float("ATTUNE_MOVE_HORIZON_S", default=1800.0),
    "move_margin": env.float("ATTUNE_MOVE_MARGIN", default=0.5),
    # An own command's start-up (launch to first progress) until one of its leases measured it.
    "own_command_startup_s": env.float("ATTUNE_OWN_COMMAND_STARTUP_S", default=30.0),
}

# GENIE's lightweight profiling run (docs/genie.md); read only by profiles_app/conf.py.
ATTUNE_GENIE_PROFILING = {
    # Queue a workload's GENIE profile by itself once its first Synergy profile is stored (no fit yet).
    "after_synergy": env.bool("ATTUNE_GENIE_AFTER_SYNERGY", default=True),
    # Per-GPU batch sizes measured on 1 GPU: these factors times the workload's batch_size (2 or 3).
    "batch_factors": env.list("ATTUNE_GENIE_BATCH_FACTORS", cast=float, default=[0.5, 1.0, 2.0]),
    "default_batch": env.int("ATTUNE_GENIE_DEFAULT_BATCH", default=32),  # a workload without batch_size
    "iters": env.int("ATTUNE_GENIE_ITERS", default=30),  # timed iterations per configuration
    "warmup_iters": env.int("ATTUNE_GENIE_WARMUP_ITERS", default=5),  # left out of the timing
    # The bound on GPU time: a configuration's launch is stopped (SIGTERM) after this many seconds.
    "max_s_per_config": env.float("ATTUNE_GENIE_MAX_S_PER_CONFIG", default=60.0),
    # The platform model (PAPERS 2.3) for a term that could not be measured: t = 2 P / B.
    "default_param_mb": env.float("ATTUNE_GENIE_DEFAULT_PARAM_MB", default=100.0),  # ~ResNet-50's
    "default_nic_gbps": env.float("ATTUNE_GENIE_DEFAULT_NIC_GBPS", default=10.0),  # Server.nic_gbps unset
    "intra_gbps": env.float("ATTUNE_GENIE_INTRA_GBPS", default=100.0),  # PCIe 3 x16 is ~12.5 GB/s
}

# Mail (notify_app's emails): Django's EMAIL_* settings. The embedded demo prints mail to the console.
EMAIL_BACKEND = env(
    "EMAIL_BACKEND",
    default="django.core.mail.backends.smtp.EmailBackend"
    if env.str("DATABASE_URL", default="")
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = env("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=10.0)  # a hung mail server must not hold a worker
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="Attune <attune@localhost>")
# Which Unix accounts users' jobs may run as (scheduler_app/job_accounts.py, its only reader): never
# root, the account the node agents run catalog workloads as (their --job-user / ATTUNE_AGENT_JOB_USER:
# give the service the same value), a reserved system name, or an account this host knows with a uid
# below the minimum. Every node checks the uid again (the agent's --min-uid / ATTUNE_AGENT_MIN_UID).
ATTUNE_JOB_ACCOUNTS = {
    "agent_job_user": env("ATTUNE_AGENT_JOB_USER", default="nobody"),
    "min_uid": env.int("ATTUNE_RUN_AS_MIN_UID", default=1000),
    # Unset: scheduler_app/job_accounts.py's DEFAULT_RESERVED (root, daemon, postgres, www-data...).
    "reserved": env.list("ATTUNE_RUN_AS_RESERVED", default=None),
}

# Notifications (notify_app); read only by notify_app/conf.py.
ATTUNE_NOTIFY = {
    "site_url": env("ATTUNE_SITE_URL", default="http://127.0.0.1:8000"),  # job links in messages
    "max_tries": env.int("ATTUNE_NOTIFY_MAX_TRIES", default=5),
    # Retry n waits backoff * 2^(n-1) s, at most backoff_max.
    "retry_backoff_s": env.float("ATTUNE_NOTIFY_RETRY_BACKOFF_S", default=30.0),
    "retry_backoff_max_s": env.float("ATTUNE_NOTIFY_RETRY_BACKOFF_MAX_S", default=600.0),
    "webhook_timeout_s": env.float("ATTUNE_NOTIFY_WEBHOOK_TIMEOUT_S", default=10.0),
    # Hosts (and their subdomains) webhooks may go to, e.g. hooks.slack.com; empty: any.
    "webhook_hosts": env.list("ATTUNE_NOTIFY_WEBHOOK_HOSTS", default=[]),
    # Webhooks reach public addresses only (checked after resolving the name, at save and at each send);
    # these CIDRs open more (e.g. 10.0.0.0/8 for an in-house chat server). Loopback, link-local, private,
    # multicast and reserved ranges are refused otherwise.
    "webhook_allowed_networks": env.list("ATTUNE_NOTIFY_WEBHOOK_ALLOWED_NETWORKS", default=[]),
    # Without a worker (the embedded demo) deliver on a thread of the web process.
    "inline": env.bool("ATTUNE_NOTIFY_INLINE", default=ATTUNE_SCHEDULER["inline_rounds"]),
}

# Node agents and liveness; read only by cluster_app/conf.py.
# One sync call per agent per interval (docs/agent-protocol.md). Between syncs the agent long-polls
# /api/v1/agent/wait, woken through Redis when its server's commands change (cluster_app/agent_wake.py):
# on by default wherever rounds run on a worker (so Redis is there), off in the embedded demo, whose
# agents then sync more often instead.
ATTUNE_AGENT_WAKE = env.bool("ATTUNE_AGENT_WAKE", default=not ATTUNE_SCHEDULER["inline_rounds"])
ATTUNE_AGENT_SYNC_INTERVAL_S = env.float(
    "ATTUNE_AGENT_SYNC_INTERVAL_S", default=10.0 if ATTUNE_AGENT_WAKE else 2.0
)
ATTUNE_AGENT_WAIT_TIMEOUT_S = env.float("ATTUNE_AGENT_WAIT_TIMEOUT_S", default=30.0)
# Agents woken by one commit are answered this far apart, all within the spread (cluster_app/agent_wake.py):
# a round that places work on a hundred servers must not bring a hundred syncs in the same instant.
ATTUNE_AGENT_WAKE_SPACING_MS = env.float("ATTUNE_AGENT_WAKE_SPACING_MS", default=20.0)
ATTUNE_AGENT_WAKE_SPREAD_MAX_MS = env.float("ATTUNE_AGENT_WAKE_SPREAD_MAX_MS", default=1000.0)
# An agent's calls run as named prepared statements on PostgreSQL (infra/prepared_sql.py): planning
# was most of their database CPU. Turn off behind a pooler in transaction mode (PgBouncer).
ATTUNE_DB_PREPARED_STATEMENTS = env.bool("ATTUNE_DB_PREPARED_STATEMENTS", default=True)
# Threads per web process serving Django (config/asgi.py); gunicorn's --workers sets the processes.
ATTUNE_WEB_THREADS = env.int("ATTUNE_WEB_THREADS", default=8)
ATTUNE_NODE_NOT_RESPONDING_AFTER_S = env.int("ATTUNE_NODE_NOT_RESPONDING_AFTER_S", default=30)
ATTUNE_NODE_DOWN_AFTER_S = env.int("ATTUNE_NODE_DOWN_AFTER_S", default=120)
# Fencing (docs/faults.md, "Fencing"): a lease its agent has not renewed (no sync answered) for
# ATTUNE_LEASE_FENCE_S is stopped on its node (SIGTERM, then SIGKILL after ATTUNE_LEASE_FENCE_GRACE_S),
# by the agent or, if the agent is gone, by the lease's shim. The service starts the job elsewhere only
# once that much time plus ATTUNE_LEASE_FENCE_MARGIN_S has passed since the node's last sync, so
# ATTUNE_NODE_DOWN_AFTER_S must be at least their sum (a system check says so).
ATTUNE_LEASE_FENCE_S = env.float("ATTUNE_LEASE_FENCE_S", default=60.0)
ATTUNE_LEASE_FENCE_GRACE_S = env.float("ATTUNE_LEASE_FENCE_GRACE_S", default=30.0)
ATTUNE_LEASE_FENCE_MARGIN_S = env.float("ATTUNE_LEASE_FENCE_MARGIN_S", default=10.0)
ATTUNE_LIVENESS_SWEEP_S = env.int("ATTUNE_LIVENESS_SWEEP_S", default=5)
# Raw usage samples older than this are rolled up into one averaged sample per minute.
ATTUNE_USAGE_RAW_RETENTION_DAYS = env.int("ATTUNE_USAGE_RAW_RETENTION_DAYS", default=2)

# Prometheus metrics at /metrics (docs/metrics.md); read only by scheduler_app/metrics/access.py. A
# scrape is let in by `Authorization: Bearer <token>` or from an allowed address (IPs or CIDRs, matched
# against REMOTE_ADDR). With neither set only loopback (127.0.0.1, ::1) may scrape.
ATTUNE_METRICS_TOKEN = env("ATTUNE_METRICS_TOKEN", default="")
ATTUNE_METRICS_ALLOWED_IPS = env.list("ATTUNE_METRICS_ALLOWED_IPS", default=[])

CELERY_BEAT_SCHEDULE = {
    "scheduling-round": {
        "task": "scheduler_app.tasks.scheduling_round_task",
        "schedule": float(ATTUNE_SCHEDULER["round_s"]),
        # A round queued behind a dead worker is useless once the next one is due.
        "options": {"expires": float(ATTUNE_SCHEDULER["round_s"])},
    },
    "node-liveness-sweep": {
        "task": "scheduler_app.tasks.node_liveness_sweep_task",
        "schedule": float(ATTUNE_LIVENESS_SWEEP_S),
        "options": {"expires": float(ATTUNE_LIVENESS_SWEEP_S)},
    },
    # Reports that syncs stored and left pending (progress; a start or an exit whose jobs a round held),
    # applied to their jobs (services/report_ingest.py). With ATTUNE_PROGRESS_APPLY_S at 0 only the
    # latter are left, rarely: swept every 10 s.
    "agent-reports-apply": {
        "task": "scheduler_app.tasks.agent_reports_apply_task",
        "schedule": ATTUNE_SCHEDULER["progress_apply_s"] or 10.0,
        "options": {"expires": ATTUNE_SCHEDULER["progress_apply_s"] or 10.0},
    },
    "usage-rollup": {
        "task": "scheduler_app.tasks.usage_rollup_task",
        "schedule": 3600.0,
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"quiet_agents": {"()": "config.log_filters.QuietAgentRequests"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {
        # runserver's access log (the demo): the agents' routine requests left out, errors kept.
        "django.server": {"handlers": ["console"], "filters": ["quiet_agents"], "propagate": False},
    },
}
