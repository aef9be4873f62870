"""What the web server of ``manage.py up`` lets one connection hold, and where each number comes from.

:class:`Limits` is every bound the server enforces before any Django code
runs: the time for a request head and for a body, the silence allowed in a
body, the body's bytes (the webhook routes have their own limit,
``CREWLET_WEBHOOK_MAX_BODY_BYTES``, everything else Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE``), and the open connections in total and per
client address. :func:`limits_from_settings` reads them from the Django
settings; a number the server reads beside them is a :class:`Setting`, read
by :func:`configured` so that a typo in the environment cannot take the
server down. The connection caps, when none is set, are derived from
``RLIMIT_NOFILE`` by :func:`derived_connection_caps`, leaving the
descriptors the engine needs.
"""
from __future__ import annotations

import logging
import math
import os
import resource
from dataclasses import dataclass
from typing import Any, Optional

#: The web server's records, whichever of its modules writes them, come from one logger.
log = logging.getLogger("crewlet.http.web")

#: After a 413, how long the rest of an oversized body is read (and dropped) before the connection is cut.
LINGER_S = 2.0
#: Defaults when the Django settings name none.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_BODY_BYTES = 2621440
#: The webhook routes' own body limit (``/webhooks/``): the setting, and its default.
WEBHOOK_MAX_BODY_SETTING = "CREWLET_WEBHOOK_MAX_BODY_BYTES"
#: Where the URLconf mounts the webhook routes, whose bodies this server gives the webhook limit.
WEBHOOKS_PREFIX = "webhooks/"
DEFAULT_WEBHOOK_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 60.0

#: What one open connection may cost in file descriptors: its socket, and the file a large body spools to.
FDS_PER_CONNECTION = 2
#: Descriptors the derived caps leave to the engine (broker, databases, logs, /healthz's own work):
#: a quarter of ``RLIMIT_NOFILE``, and never fewer than this.
RESERVED_FDS_MIN = 128
#: A derived total never goes below this, however small ``RLIMIT_NOFILE`` is.
CONNECTIONS_MIN = 8
#: A client address's derived share of the total (an eighth of it), within [PER_CLIENT_MIN, PER_CLIENT_MAX].
PER_CLIENT_SHARE = 8
PER_CLIENT_MIN = 4
PER_CLIENT_MAX = 256
#: How many shed connections may linger at once (answered 503, reading what the client still sends);
#: past it a shed connection is closed with no answer, so shedding itself holds a bounded number of descriptors.
SHED_LINGER_MAX = 16
#: ``RLIMIT_NOFILE`` when it is unlimited, for deriving the caps.
NOFILE_UNLIMITED = 1 << 20


@dataclass(frozen=True)
class Setting:
    """A number the web server reads: its Django setting, the environment variable it comes from, default and range."""

    name: str
    env: str
    default: float
    low: float
    high: float
    #: A count: a fraction is refused, never cut.
    integer: bool = False


#: A body's whole time, from the end of its head.
BODY_TIMEOUT = Setting("HTTP_BODY_TIMEOUT_S", "CREWLET_HTTP_BODY_TIMEOUT_S", DEFAULT_BODY_TIMEOUT_S, 0.1, 3600.0)
#: Open connections in total, and per client address; 0: derived from ``RLIMIT_NOFILE``.
MAX_CONNECTIONS = Setting("HTTP_MAX_CONNECTIONS", "CREWLET_HTTP_MAX_CONNECTIONS", 0, 0, 1_000_000, integer=True)
MAX_CONNECTIONS_PER_CLIENT = Setting(
    "HTTP_MAX_CONNECTIONS_PER_CLIENT", "CREWLET_HTTP_MAX_CONNECTIONS_PER_CLIENT", 0, 0, 1_000_000, integer=True
)
#: Live ``/ws/stream`` sockets one node serves (each holds a broker consumer; eventstore.stream sheds past it).
MAX_STREAMS = Setting("WS_MAX_STREAMS", "CREWLET_WS_MAX_STREAMS", 200, 1, 100_000, integer=True)


def configured(setting: Setting) -> float:
    """``setting``'s value: the Django setting, else its environment variable, else its default.

    The environment is read here too so a setting works before
    ``crewlet/settings.py`` names it; a value that is not a number in the
    setting's range is logged and the default used, so a typo cannot take the
    web server down.
    """
    value: Any = None
    try:
        from django.conf import settings

        value = getattr(settings, setting.name, None)
    except Exception:  # pragma: no cover - settings not configured (a bare script)
        value = None
    if value is None:
        value = os.environ.get(setting.env, "").strip() or None
    if value is None:
        return setting.default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    whole = not setting.integer or number.is_integer()
    if not (setting.low <= number <= setting.high and whole):  # NaN and infinities fail this too
        log.warning(
            "web_setting_invalid",
            extra={"setting": setting.env, "value": str(value), "low": setting.low, "high": setting.high,
                   "default": setting.default},
        )
        return setting.default
    return number


def nofile_limit() -> int:
    """This process's soft ``RLIMIT_NOFILE`` (:data:`NOFILE_UNLIMITED` when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NOFILE_UNLIMITED if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def derived_connection_caps(nofile: int) -> tuple[int, int]:
    """(total, per client address) for a process allowed ``nofile`` descriptors.

    A quarter of them (at least :data:`RESERVED_FDS_MIN`) and the lingering
    sheds' are left to the engine — the broker connection, the databases, the
    logs — so the server's clients cannot starve it; the rest is divided by
    what a connection may cost (:data:`FDS_PER_CONNECTION`). One address gets
    an eighth of the total (within [:data:`PER_CLIENT_MIN`,
    :data:`PER_CLIENT_MAX`]), so one client cannot take every connection a
    webhook or ``/healthz`` needs.
    """
    reserve = max(RESERVED_FDS_MIN, nofile // 4)
    total = max(CONNECTIONS_MIN, (nofile - reserve - SHED_LINGER_MAX) // FDS_PER_CONNECTION)
    per_client = min(total, PER_CLIENT_MAX, max(PER_CLIENT_MIN, total // PER_CLIENT_SHARE))
    return total, per_client


@dataclass(frozen=True)
class Limits:
    """What one connection may make the server hold: time for a request head and a body, silence in a body, body bytes;
    and how many connections may be open, in total and per client address."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Path prefix -> its own body limit (the webhooks').
    body_limits: tuple[tuple[str, int], ...] = ()
    #: Behind a proxy that sets X-Forwarded-For/-Proto itself: the client is the one it names.
    behind_proxy: bool = False
    #: Open connections in total and per client address; None: derived from ``RLIMIT_NOFILE`` when the server starts.
    max_connections: Optional[int] = None
    max_connections_per_client: Optional[int] = None

    def body_limit(self, path: str) -> int:
        for prefix, limit in self.body_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body_bytes

    def connection_caps(self, nofile: int) -> tuple[int, int]:
        """(total, per client address; 0 = none) for a process allowed ``nofile`` descriptors.

        Behind a proxy every connection comes from the proxy, so the derived
        per-address cap is not applied there (the proxy limits its clients);
        one set explicitly still is.
        """
        total, per_client = derived_connection_caps(nofile)
        if self.max_connections is not None:
            total = self.max_connections
        if self.max_connections_per_client is not None:
            per_client = self.max_connections_per_client
        elif self.behind_proxy:
            per_client = 0
        return total, min(per_client, total)


def webhook_max_body_bytes() -> int:
    """The webhook routes' body limit: Django setting, else the environment variable, else 1 MiB.

    The web server enforces it as the bytes arrive and the webhook edge checks
    it again on the body, so both read it here, in the core.
    """
    value: Any = None
    try:
        from django.conf import settings

        value = getattr(settings, WEBHOOK_MAX_BODY_SETTING, None)
    except Exception:  # pragma: no cover - settings not configured (a bare script)
        value = None
    if value is None:
        value = os.environ.get(WEBHOOK_MAX_BODY_SETTING) or DEFAULT_WEBHOOK_MAX_BODY_BYTES
    try:
        limit = int(value)
    except (TypeError, ValueError):
        return DEFAULT_WEBHOOK_MAX_BODY_BYTES
    return limit if limit > 0 else DEFAULT_WEBHOOK_MAX_BODY_BYTES


def limits_from_settings() -> Limits:
    """The limits the Django settings (and the webhook routes' own setting) give."""
    from django.conf import settings

    general = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None) or DEFAULT_MAX_BODY_BYTES
    total = int(configured(MAX_CONNECTIONS))
    per_client = int(configured(MAX_CONNECTIONS_PER_CLIENT))
    return Limits(
        header_timeout_s=float(getattr(settings, "HTTP_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)),
        idle_timeout_s=float(getattr(settings, "HTTP_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)),
        body_timeout_s=configured(BODY_TIMEOUT),
        max_body_bytes=int(general),
        body_limits=(("/" + WEBHOOKS_PREFIX, webhook_max_body_bytes()),),
        behind_proxy=bool(getattr(settings, "SECURE_PROXY_SSL_HEADER", None)),
        max_connections=total or None,
        max_connections_per_client=per_client or None,
    )


__all__ = [
    "BODY_TIMEOUT",
    "CONNECTIONS_MIN",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_WEBHOOK_MAX_BODY_BYTES",
    "FDS_PER_CONNECTION",
    "LINGER_S",
    "Limits",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_CLIENT",
    "MAX_STREAMS",
    "NOFILE_UNLIMITED",
    "PER_CLIENT_MAX",
    "PER_CLIENT_MIN",
    "PER_CLIENT_SHARE",
    "RESERVED_FDS_MIN",
    "SHED_LINGER_MAX",
    "Setting",
    "WEBHOOKS_PREFIX",
    "WEBHOOK_MAX_BODY_SETTING",
    "configured",
    "derived_connection_caps",
    "limits_from_settings",
    "nofile_limit",
    "webhook_max_body_bytes",
]
