"""Helpers the notifications tests share: the company, the fixtures, vendor signatures, raw deliveries."""
from __future__ import annotations

import copy
import hashlib
import hmac
import json
import re
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote, urlencode

import pytest

from tests.conftest import SHARED_DIR, skip_or_fail
from crewlet import events
from crewlet.events import Event
from crewlet.events.types import RawWebhook
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from crewlet.events.tracing import Trace
from notifications.sources import PARSERS

WEBHOOKS_DIR = SHARED_DIR / "fixtures" / "webhooks"
README = SHARED_DIR / "fixtures" / "README.md"

# Identities chosen to meet the fixtures: W111 is the Slack bot the bolt
# fixtures' events are authorized for, octocat the reviewer GitHub's PR
# fixture requests, Codertocat its sender and assignee, and the Mattermost
# ids the DM fixture's member and the channel fixtures' mention.
ADA_MM_ID = "xei6dqz8xfgm7kqzddjziyofyo"
LINUS_MM_ID = "qmw86q7qsjriura9jos75i4why"

SECRETS = {
    "slack": ("SLACK_SIGNING_SECRET", "slack-signing-secret"),
    "github": ("GITHUB_WEBHOOK_SECRET", "github-webhook-secret"),
    "jira": ("JIRA_WEBHOOK_SECRET", "jira-webhook-secret"),
    "confluence": ("CONFLUENCE_WEBHOOK_SECRET", "confluence-webhook-secret"),
    "mattermost": ("MATTERMOST_TOKEN", "mattermost-token"),
}
SECRET_KEYS = {"slack": "signing_secret_env", "mattermost": "token_env"}


def company(
    *,
    verify: bool = False,
    rate_limit: float = 0,
    surfaces: Optional[dict[str, Any]] = None,
) -> Organization:
    """ada and linus (agents) and grace (human), with identities on every surface."""
    if surfaces is None:
        surfaces = {
            name: {SECRET_KEYS.get(name, "secret_env"): env, "verify": verify} for name, (env, _) in SECRETS.items()
        }
    return parse_company(
        {
            "org": "acme",
            "providers": {"llm": [{"kind": "echo"}]},
            "notification_rate_limit": rate_limit,
            "surfaces": surfaces,
            "seats": [
                {
                    "handle": "ada",
                    "kind": "agent",
                    "role": "engineer",
                    "identities": {
                        "slack": "W111",
                        "github": "octocat",
                        "jira": "acc-ada",
                        "confluence": "acc-ada",
                        "mattermost": ADA_MM_ID,
                    },
                },
                {
                    "handle": "linus",
                    "kind": "agent",
                    "role": "reviewer",
                    "identities": {
                        "slack": "U0LINUS",
                        "github": "Codertocat",
                        "jira": "acc-linus",
                        "mattermost": LINUS_MM_ID,
                    },
                },
                {
                    "handle": "grace",
                    "kind": "human",
                    "role": "lead",
                    "identities": {"slack": "U0GRACE", "github": "grace-h", "jira": "acc-grace", "mattermost": "grace"},
                },
            ],
        }
    )


def holder(org: Optional[Organization] = None) -> CompanyHolder:
    return CompanyHolder(org or company())


# -- fixtures ---------------------------------------------------------------------


def fixture_files() -> list[Path]:
    """Every webhook fixture, or [] when ../shared is not there (the tests then skip, or fail in CI)."""
    if not WEBHOOKS_DIR.is_dir():
        return []
    return sorted(WEBHOOKS_DIR.glob("*/*.json"))


def fixture_params() -> list[Any]:
    files = fixture_files()
    if files:
        return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in files]
    return [pytest.param(None, id="fixtures-missing")]


def need(path: Optional[Path]) -> Path:
    if path is None or not path.is_file():
        skip_or_fail(f"webhook fixtures not found under {WEBHOOKS_DIR} (expected ../shared/fixtures beside the repository)")
    assert path is not None
    return path


def fixture_bytes(source: str, name: str) -> bytes:
    path = WEBHOOKS_DIR / source / name
    if not path.is_file():
        skip_or_fail(f"webhook fixture {source}/{name} not found under {WEBHOOKS_DIR}")
    return path.read_bytes()


def fixture(source: str, name: str) -> dict[str, Any]:
    return json.loads(fixture_bytes(source, name))


def readme_keys() -> dict[str, str]:
    """``<dir>/<file>`` -> the partition key the fixtures README gives it ("" for none)."""
    if not README.is_file():
        skip_or_fail(f"fixtures README not found at {README}")
    keys: dict[str, str] = {}
    section = ""
    for line in README.read_text(encoding="utf-8").splitlines():
        head = re.match(r"^## .*\(webhooks/([a-z]+)/\)", line)
        if head:
            section = head.group(1)
            continue
        if line.startswith("## "):
            section = ""
        row = re.match(r"^\| `([^`]+\.json)` \| [^|]* \| ([^|]*) \|", line)
        if section and row:
            key = row.group(2).strip()
            keys[f"{section}/{row.group(1)}"] = key.strip("`") if key.startswith("`") else ""
    return keys


def github_event_of(name: str) -> str:
    """The X-GitHub-Event a fixture was delivered under: its file name's first part."""
    return name.split("-", 1)[0]


# -- signing ----------------------------------------------------------------------


def hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def slack_headers(body: bytes, secret: str = SECRETS["slack"][1], *, at: Optional[float] = None) -> dict[str, str]:
    stamp = str(int(time.time() if at is None else at))
    sig = "v0=" + hex_hmac(secret, f"v0:{stamp}:".encode() + body)
    return {"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": stamp}


def hub256_headers(body: bytes, secret: str = SECRETS["github"][1]) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + hex_hmac(secret, body)}


def hub_headers(body: bytes, secret: str) -> dict[str, str]:
    return {"X-Hub-Signature": "sha256=" + hex_hmac(secret, body)}


def set_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value in SECRETS.values():
        monkeypatch.setenv(env, value)


# -- raw deliveries, as the edge publishes them -------------------------------------------


def raw_delivery(
    source: str,
    body: bytes | dict[str, Any],
    *,
    event_name: str = "",
    delivery_id: str = "",
    trace: Optional[Trace] = None,
) -> Event:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    parser = PARSERS.get(source)
    surface = parser.surface if parser is not None else "webhook"
    data = RawWebhook(surface=surface, event_name=event_name, provider=source, delivery_id=delivery_id)
    data.set_raw_bytes(raw)
    return events.new(data, trace or Trace.root(), source=source)


def slack_message(
    text: str,
    *,
    channel: str = "C777",
    ts: str = "1718000000.000100",
    thread_ts: str = "",
    user: str = "W222",
    channel_type: str = "channel",
    event_id: str = "",
    authorized: str = "W111",
) -> dict[str, Any]:
    """A Slack ``message`` event_callback shaped like the bolt fixtures."""
    event: dict[str, Any] = {
        "type": "message",
        "user": user,
        "text": text,
        "ts": ts,
        "channel": channel,
        "event_ts": ts,
        "channel_type": channel_type,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return {
        "token": "verification_token",
        "team_id": "T111",
        "api_app_id": "A111",
        "event": event,
        "type": "event_callback",
        "event_id": event_id or f"Ev{abs(hash((text, channel, ts, user))) % 10**9}",
        "event_time": int(float(ts)),
        "authorizations": [{"team_id": "T111", "user_id": authorized, "is_bot": True}],
    }


def with_changes(payload: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of a fixture with top-level keys replaced."""
    out = copy.deepcopy(payload)
    out.update(changes)
    return out



def github_form(json_text: bytes) -> bytes:
    """The body GitHub sends under ``application/x-www-form-urlencoded``: the JSON in one ``payload`` field."""
    return urlencode({"payload": json_text.decode("utf-8")}).encode("ascii")


def slash(text: str, *, command: str = "/ask", trigger: str = "", user: str = "U0GRACE", channel: str = "C777", **extra: str) -> bytes:
    """A slash command's form body, with the fields Slack's documentation lists for one."""
    fields = {
        "token": "verification_token", "team_id": "T111", "team_domain": "acme", "channel_id": channel,
        "channel_name": "general", "user_id": user, "user_name": "grace", "command": command, "text": text,
        "api_app_id": "A111", "is_enterprise_install": "false",
        "response_url": "https://hooks.slack.com/commands/T111/1/x", "trigger_id": trigger or f"{time.monotonic_ns()}.1.ab",
    }
    fields.update(extra)
    return urlencode(fields).encode("ascii")


def interaction(payload: dict[str, Any]) -> bytes:
    return f"payload={quote(json.dumps(payload))}".encode("ascii")


def block_actions(*, author: str = "W111", trigger: str = "111.222.valid", thread_ts: str = "") -> dict[str, Any]:
    """A button click on a message ``author`` posted, shaped as Slack's block_actions payload."""
    message: dict[str, Any] = {"type": "message", "user": author, "ts": "1718000000.000100", "text": "Deploy the fix?"}
    if thread_ts:
        message["thread_ts"] = thread_ts
    return {
        "type": "block_actions",
        "user": {"id": "U0GRACE", "username": "grace", "name": "grace", "team_id": "T111"},
        "api_app_id": "A111",
        "token": "verification_token",
        "container": {"type": "message", "message_ts": "1718000000.000100", "channel_id": "C777", "is_ephemeral": False},
        "trigger_id": trigger,
        "team": {"id": "T111", "domain": "acme"},
        "channel": {"id": "C777", "name": "general"},
        "message": message,
        "response_url": "https://hooks.slack.com/actions/T111/1/x",
        "actions": [
            {"action_id": "deploy", "block_id": "b", "text": {"type": "plain_text", "text": "Deploy"}, "value": "yes",
             "type": "button", "action_ts": "1718000001.000200"}
        ],
    }
