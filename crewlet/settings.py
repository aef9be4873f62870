"""Django settings for Crewlet.

Web/ORM settings only. The engine's own settings (stream.*, node.*) are typed
and validated in :mod:`crewlet.company.conf`; nothing here duplicates them.

Environment:
  CREWLET_DATABASE      sqlite (default, solo) | postgres (fleets, the test suite)
  CREWLET_PG_HOST/PORT/USER/PASSWORD, CREWLET_PG_DBNAME, CREWLET_PG_EVENTS_DBNAME
  CREWLET_VAR_DIR       where SQLite files and local state live (default ./var)
  CREWLET_SECRET_KEY    required to be shared by every node of a fleet
  CREWLET_DEBUG, CREWLET_ALLOWED_HOSTS, CREWLET_LOG_LEVEL, CREWLET_LOG_FORMAT (kv|json)
  CREWLET_CORS_ALLOWED_ORIGINS  browser origins allowed to call /api/ with a token (none by default)

Every variable read here is checked as it is read: a bad one is an
:class:`EnvironmentValueError` (``<VAR>=<value>: <what is allowed>``, one
line, never a secret's value), which stops Django loading its settings and
which ``manage.py`` prints as that one line.
"""
from __future__ import annotations

import logging
import math
import os
import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Optional

from django.core.exceptions import ImproperlyConfigured

from crewlet.company.refusal import FieldValueError
from crewlet.base.redact import REDACTED
from crewlet.http.limits import (
    BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_WEBHOOK_MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_STREAMS,
    WEBHOOK_MAX_BODY_SETTING,
)

BASE_DIR = Path(__file__).resolve().parent.parent

#: What a boolean variable may say; empty (or unset) is its default.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
DATABASE_KINDS = ("sqlite", "postgres")
LOG_FORMATS = ("kv", "json")
#: The level names the logging module knows (CREWLET_LOG_LEVEL, any case).
LOG_LEVELS = tuple(logging.getLevelNamesMapping())


class EnvironmentValueError(FieldValueError, ImproperlyConfigured):
    """A Django-side environment variable refused: ``<VAR>=<value>: <what is allowed>``.

    An ImproperlyConfigured, so Django stops loading its settings on it, and a
    FieldValueError, so it reads like every engine setting and company file
    refusal (bounded, one line).
    """


def _env(name: str, env: Mapping[str, str] = os.environ, *, default: str = "", secret: bool = False) -> str:
    """A variable's text (``default`` when unset); one that is not UTF-8 is refused, a secret's never quoted.

    os.environ holds undecodable bytes as lone surrogates, which fail later and
    far away: in a SQLite path, a signing key, a log line.
    """
    value = env.get(name, default)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EnvironmentValueError(name, REDACTED if secret else value, "is not UTF-8 text") from None
    return value


def _flag(name: str, default: bool = False) -> bool:
    """A boolean variable: one of TRUE_WORDS or FALSE_WORDS (any case); anything else is refused, never read as false."""
    raw = _env(name)
    value = raw.strip().lower()
    if value == "":
        return default
    if value not in TRUE_WORDS + FALSE_WORDS:
        raise EnvironmentValueError(name, raw, f"must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")
    return value in TRUE_WORDS


def _bounded(name: str, value: str, low: float, high: float, allowed: str, *, whole: bool) -> float:
    """``value`` read as a finite number within [low, high] (a whole one when ``whole``), else refused with ``allowed``."""
    try:
        number = float(value)
    except ValueError:
        raise EnvironmentValueError(name, value, allowed) from None
    if not math.isfinite(number) or (whole and not number.is_integer()) or not low <= number <= high:
        raise EnvironmentValueError(name, value, allowed)
    return number


def _number(name: str, default: float, low: float, high: float) -> float:
    """A finite numeric variable within [low, high]; a bad one stops start-up naming it."""
    value = _env(name).strip()
    if not value:
        return default
    return _bounded(name, value, low, high, f"must be a number between {low:g} and {high:g}", whole=False)


def _integer(name: str, default: int, low: int, high: int, env: Mapping[str, str] = os.environ) -> int:
    """A whole-number variable within [low, high] (``2.5e6`` is one; ``2.5`` is refused, never cut to 2)."""
    value = _env(name, env).strip()
    if not value:
        return default
    return int(_bounded(name, value, low, high, f"must be a whole number between {low} and {high}", whole=True))


def _choice(name: str, default: str, choices: tuple[str, ...], env: Mapping[str, str] = os.environ, *, fold: bool = False) -> str:
    """One of ``choices`` (compared upper-cased when ``fold``); unset or empty is ``default``."""
    value = _env(name, env).strip()
    if not value:
        return default
    chosen = value.upper() if fold else value
    if chosen not in choices:
        raise EnvironmentValueError(name, value, f"must be one of {', '.join(choices)}")
    return chosen


def _instant(name: str) -> Optional[float]:
    """An ISO 8601 instant with its UTC offset, as epoch seconds; unset or empty is None."""
    value = _env(name).strip()
    if not value:
        return None
    allowed = "must be an ISO 8601 instant with its UTC offset, like 2025-03-31T08:59:58+02:00"
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise EnvironmentValueError(name, value, allowed) from None
    if instant.tzinfo is None:
        raise EnvironmentValueError(name, value, allowed)
    return instant.timestamp()


def _list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in (_env(name) or default).split(",") if item.strip()]


VAR_DIR = Path(_env("CREWLET_VAR_DIR") or BASE_DIR / "var").resolve()


def _secret_key() -> str:
    """The env key when given (a fleet must share one), else a per-install key kept in var/.

    Never a constant in the repository: that would sign every laptop's
    sessions with a key anyone can read.
    """
    key = _env("CREWLET_SECRET_KEY", secret=True)
    if key:
        return key
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # Written aside, then linked into place: a process starting at the same
    # moment sees either no file or the whole key, and both end up with one key.
    tmp = path.with_name(f".secret_key.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        key = path.read_text().strip()
    finally:
        tmp.unlink()
    return key


def database_settings(env: Mapping[str, str], var_dir: Path) -> dict[str, dict[str, Any]]:
    """The two aliases: ``default`` (coordination store) and ``events`` (this node's event store).

    Solo: two SQLite files under ``var_dir`` (two files, so a write on one
    alias never waits for the other's lock), WAL so the web and engine
    processes read while the other writes, and IMMEDIATE transactions so a
    writer takes the lock up front instead of failing on upgrade. Their test
    databases are files beside them, so tests see the locking ``up`` sees.
    PostgreSQL: one server, two databases, each with its own test database
    name so pytest-django creates both.
    """
    kind = _choice("CREWLET_DATABASE", "sqlite", DATABASE_KINDS, env)
    if kind == "sqlite":
        def sqlite(name: str) -> dict[str, Any]:
            return {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(var_dir / name),
                "OPTIONS": {
                    "timeout": 20,
                    "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                },
                # Tests run on files too, as bin/up does: an in-memory test database shares
                # one cache whose table locks fail at once where a file's writers wait.
                "TEST": {"NAME": str(var_dir / f"test_{name}")},
            }

        return {"default": sqlite("crewlet.sqlite3"), "events": sqlite("events.sqlite3")}
    if kind == "postgres":
        # Unset means libpq's default port; a given one must be a port, not whatever libpq makes of it.
        port_number = _integer("CREWLET_PG_PORT", 0, 1, 65535, env)
        port = str(port_number) if port_number else ""

        def postgres(name: str) -> dict[str, Any]:
            return {
                "ENGINE": "django.db.backends.postgresql",
                "HOST": _env("CREWLET_PG_HOST", env, default="/var/run/postgresql"),
                "PORT": port,
                # Empty means libpq's default: the OS user (root on these machines).
                "USER": _env("CREWLET_PG_USER", env),
                "PASSWORD": _env("CREWLET_PG_PASSWORD", env, secret=True),
                "NAME": name,
                "CONN_HEALTH_CHECKS": True,
                "TEST": {"NAME": f"test_{name}"},
            }

        events = postgres(_env("CREWLET_PG_EVENTS_DBNAME", env) or "crewlet_events")
        # The event store runs a few fixed statements very often (the writer's insert,
        # a page of events): parameters bound server-side, so psycopg can prepare them.
        events["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
        return {"default": postgres(_env("CREWLET_PG_DBNAME", env) or "crewlet"), "events": events}
    raise EnvironmentValueError("CREWLET_DATABASE", kind, f"must be one of {', '.join(DATABASE_KINDS)}")


SECRET_KEY = _secret_key()
DEBUG = _flag("CREWLET_DEBUG")
ALLOWED_HOSTS = _list("CREWLET_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
#: Origins (scheme://host[:port]) other than the site's own trusted for unsafe requests and /ws/stream.
CSRF_TRUSTED_ORIGINS = _list("CREWLET_TRUSTED_ORIGINS")


def _origins(name: str) -> list[str]:
    """Browser origins, comma-separated: each ``http(s)://host[:port]`` exactly (no path, no trailing slash)."""
    origins = _list(name)
    for origin in origins:
        if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+", origin):
            raise EnvironmentValueError(name, origin, "must be origins like https://app.example.com, separated by commas")
    return origins


#: Origins a browser app may call /api/ from with an operator token (django-cors-headers); none by default.
#: The credential is the Authorization header, never the session cookie, so credentials are not allowed.
CORS_ALLOWED_ORIGINS = _origins("CREWLET_CORS_ALLOWED_ORIGINS")
CORS_URLS_REGEX = r"^/api/"
CORS_ALLOW_CREDENTIALS = False
CORS_EXPOSE_HEADERS = ["X-Crewlet-Trace-Id"]

# The web server (crewlet.http.web). A connection has HTTP_HEADER_TIMEOUT_S to send a
# whole request head (from its opening, or from the end of its previous
# response); silent for HTTP_IDLE_TIMEOUT_S while sending a body, it is closed.
# A body over DATA_UPLOAD_MAX_MEMORY_SIZE (webhooks: CREWLET_WEBHOOK_MAX_BODY_BYTES)
# is refused with 413 as soon as that many bytes have arrived.
HTTP_HEADER_TIMEOUT_S = _number("CREWLET_HTTP_HEADER_TIMEOUT_S", 10.0, 0.1, 3600.0)
HTTP_IDLE_TIMEOUT_S = _number("CREWLET_HTTP_IDLE_TIMEOUT_S", 30.0, 0.1, 3600.0)
DATA_UPLOAD_MAX_MEMORY_SIZE = _integer("CREWLET_HTTP_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024, 1024**3)
#: The webhook routes' own body limit (crewlet.http.limits reads it from here, and the edge checks it again).
CREWLET_WEBHOOK_MAX_BODY_BYTES = _integer(WEBHOOK_MAX_BODY_SETTING, DEFAULT_WEBHOOK_MAX_BODY_BYTES, 1024, 1024**3)
#: A request body must be whole this long after its head, however slowly it trickles (then 408).
HTTP_BODY_TIMEOUT_S = _number(BODY_TIMEOUT.env, BODY_TIMEOUT.default, BODY_TIMEOUT.low, BODY_TIMEOUT.high)
#: Open connections in total and per client address; 0 derives each from RLIMIT_NOFILE (crewlet.http.limits).
HTTP_MAX_CONNECTIONS, HTTP_MAX_CONNECTIONS_PER_CLIENT = (
    _integer(s.env, int(s.default), int(s.low), int(s.high)) for s in (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT)
)
#: An open /ws/stream checks its credential again this often (a revoked one closes it).
WS_CREDENTIAL_RECHECK_S = _number("CREWLET_WS_RECHECK_S", 10.0, 0.1, 3600.0)
#: Live /ws/stream sockets one node serves (each holds a broker consumer); past it, 4013.
WS_MAX_STREAMS = _integer(MAX_STREAMS.env, int(MAX_STREAMS.default), int(MAX_STREAMS.low), int(MAX_STREAMS.high))
#: Failed sign-ins allowed for one account from one client address in LOGIN_FAILURE_WINDOW_S, then 429;
#: one address may fail LOGIN_ADDRESS_FAILURE_LIMIT times across every username.
LOGIN_FAILURE_LIMIT = _integer("CREWLET_LOGIN_FAILURES", 5, 1, 1000)
LOGIN_FAILURE_WINDOW_S = _number("CREWLET_LOGIN_WINDOW_S", 60.0, 1.0, 86400.0)
LOGIN_ADDRESS_FAILURE_LIMIT = _integer("CREWLET_LOGIN_ADDRESS_FAILURES", 4 * LOGIN_FAILURE_LIMIT, 1, 10_000)
#: /healthz waits this long for the broker to answer a round trip before calling it unresponsive.
HEALTH_BROKER_TIMEOUT_S = _number("CREWLET_HEALTH_BROKER_TIMEOUT_S", 1.5, 0.05, 30.0)
#: /readyz gives each store this long to answer a query before calling it unreachable.
HEALTH_STORE_TIMEOUT_S = _number("CREWLET_HEALTH_STORE_TIMEOUT_S", 2.0, 0.05, 30.0)
#: A surface's socket client (Slack Socket Mode, Mattermost's websocket) waits this long before its first
#: reconnect, doubling up to the maximum while the vendor stays away; it pings the vendor this often.
SURFACE_SOCKET_RETRY_MIN_S = _number("CREWLET_SOCKET_RETRY_MIN_S", 1.0, 0.01, 600.0)
SURFACE_SOCKET_RETRY_MAX_S = _number("CREWLET_SOCKET_RETRY_MAX_S", 60.0, 0.01, 3600.0)
SURFACE_SOCKET_PING_S = _number("CREWLET_SOCKET_PING_S", 10.0, 0.1, 600.0)
#: A rehearsal of the company's schedules: the scheduler's clock reads this instant at its first pass and runs at
#: real speed from there (seats.scheduler.StartedClock), so what fires at a given instant can be watched now.
#: None (unset) is the real clock; every other clock of the node stays real.
SCHEDULER_CLOCK_START_S = _instant("CREWLET_SCHEDULER_CLOCK_START")
#: A bearer token that may read GET /metrics and nothing else (an operator token may too); "" = none.
METRICS_TOKEN = _env("CREWLET_METRICS_TOKEN", secret=True).strip()
if METRICS_TOKEN and (len(METRICS_TOKEN) < 16 or not METRICS_TOKEN.isascii() or any(c.isspace() for c in METRICS_TOKEN)):
    raise ImproperlyConfigured("CREWLET_METRICS_TOKEN must be at least 16 ASCII characters with no spaces")

LOGIN_URL = "dash-login"
LOGIN_REDIRECT_URL = "dash-overview"

# Production behind TLS (what `manage.py check --deploy` asks for; README "Production").
# Off by default: `up` on a laptop is plain http, where secure-only cookies would never be sent back.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _flag("CREWLET_SECURE_COOKIES")
SECURE_HSTS_SECONDS = _integer("CREWLET_HSTS_SECONDS", 0, 0, 10 * 365 * 86400)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("CREWLET_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _flag("CREWLET_HSTS_PRELOAD")
SECURE_SSL_REDIRECT = _flag("CREWLET_SSL_REDIRECT")
#: Load balancers probe /healthz over plain http: never redirected.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$", r"^readyz$"]
if _flag("CREWLET_BEHIND_TLS_PROXY"):
    # Only behind a proxy that sets this header itself (and strips a client's): then a request is https when it says so.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's and Redoc's files, served by the node itself (no CDN)
    "corsheaders",  # CORS for /api/ from CREWLET_CORS_ALLOWED_ORIGINS (its middleware is in only when one is set)
    "crewlet",
    "seats",
    "seats.memory",
    "seats.sandbox",
    "notifications",
    "eventstore",
    "a2a",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "crewlet.http.throttle.SignInThrottleMiddleware",  # failed sign-ins per address and username: 429 past the limit
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
if CORS_ALLOWED_ORIGINS:  # first: a preflight is answered before authentication could refuse it
    MIDDLEWARE.insert(0, "corsheaders.middleware.CorsMiddleware")

ROOT_URLCONF = "crewlet.urls"
WSGI_APPLICATION = "crewlet.wsgi.application"
ASGI_APPLICATION = "crewlet.asgi.application"

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

DATABASES = database_settings(os.environ, VAR_DIR)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # sqlite3 cannot create the directory itself
DATABASE_ROUTERS = ["crewlet.base.db_router.EventStoreRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# /api/*: an operator token (Authorization: Bearer) or a signed-in staff
# session, else 401 (crewlet.http.auth). JSON only; OpenAPI at /api/schema/.
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "crewlet.http.auth.OperatorTokenAuthentication",  # first: its challenge makes a refusal a 401
        "crewlet.http.auth.StaffSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["crewlet.http.auth.IsOperator"],
    "DEFAULT_RENDERER_CLASSES": ["crewlet.http.renderers.OrjsonRenderer"],  # DRF's JSON values, ~10x faster
    "UNICODE_JSON": False,  # only DRF's own renderer reads it (the indented and fallback answers): \u-escaped
    "DEFAULT_PARSER_CLASSES": ["crewlet.http.bodies.JSONObjectParser"],  # objects only, depth-limited, storable strings
    "DEFAULT_SCHEMA_CLASS": "crewlet.http.schema.AutoSchema",  # request bodies closed: additionalProperties false
    "EXCEPTION_HANDLER": "crewlet.http.bodies.exception_handler",
}
SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Crewlet API",
    "DESCRIPTION": "Reads of the company's event history. Every route needs an operator token or a staff session.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["crewlet.http.auth.IsOperator"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "crewlet.http.errors.declare_errors"],
}

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# Structured logs on stderr: one line per record, the message is the event name
# (e.g. engine_started) and `extra={...}` fields are rendered as keys. Every
# handler redacts credentials (crewlet.base.logfmt.RedactSecrets), and so do the
# loggers that carry whole requests (django.request puts the request, query
# string included, on every 4xx/5xx record).
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "trace": {"()": "crewlet.base.logfmt.TraceContext"},
        "redact": {"()": "crewlet.base.logfmt.RedactSecrets"},
    },
    "formatters": {
        "kv": {"()": "crewlet.base.logfmt.KeyValueFormatter"},
        "json": {"()": "crewlet.base.logfmt.JsonFormatter"},
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": _choice("CREWLET_LOG_FORMAT", "kv", LOG_FORMATS),
            "filters": ["trace", "redact"],
        },
    },
    "root": {"handlers": ["stderr"], "level": _choice("CREWLET_LOG_LEVEL", "INFO", LOG_LEVELS, fold=True)},
    "loggers": {
        # Django logs request errors itself; keep its chatter at WARNING.
        "django": {"level": "WARNING", "propagate": True},
        "django.request": {"filters": ["redact"], "propagate": True},
        "django.server": {"filters": ["redact"], "propagate": True},
        "asyncio": {"level": "WARNING", "propagate": True},
        "nats": {"level": "WARNING", "propagate": True},
        # The model and MCP SDKs' HTTP client logs every request at INFO; a turn logs its own rounds.
        "httpx2": {"level": "WARNING", "propagate": True},
        # So does the Mattermost driver's (httpx), on every tool call and working-indicator call.
        "httpx": {"level": "WARNING", "propagate": True},
    },
}
