"""Hypothesis against a running `up`: every webhook route and every /api/ parameter answers 2xx or 4xx, never 5xx.

Bodies are signed with the surface's real secret, so they pass verification
and reach the parsers — the deep end of the edge. Every Slack DM among them
that was accepted (202) must run exactly once: an accepted delivery that no
seat can ever process is the worst outcome the edge can have. Bounded: a fixed
number of examples per route, no deadline (the server is a real process).
"""
from __future__ import annotations

import json
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import Figures
from tests.faults.fault_support import (
    SECRETS,
    TOKEN,
    Delivery,
    Sender,
    Up,
    company_yaml,
    new_channel,
    request,
    sign_hub,
    sign_slack,
    slack_dm,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = 60
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20
)
#: Text as a vendor's JSON may carry it: any code point, lone surrogates and NULs included.
wild_text = st.text(alphabet=st.characters(codec=None), max_size=60)


def nested(depth: int, leaf: Any = "x") -> Any:
    out: Any = leaf
    for _ in range(depth):
        out = {"content": [out], "type": "paragraph"}
    return out


def deep_json(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def _post(up: Up, source: str, body: bytes, headers: dict[str, str], query: str = "") -> int:
    status, answer = request(f"{up.url}/webhooks/{source}{query}", "POST", body, headers)
    assert status < 500, f"{source}: {status} {answer[:300]!r} for body {body[:300]!r}"
    return status


@pytest.fixture
def up(tmp_path: Path) -> Any:
    running = Up(tmp_path, company=company_yaml())
    running.start()
    yield running
    running.cleanup()


def test_fuzzed_signed_slack_deliveries_are_refused_or_run_exactly_once(up: Up, figures: Figures) -> None:
    sender = Sender(up)
    counts = {"sent": 0, "refused": 0}

    @FUZZ
    @given(text=wild_text, event_suffix=wild_text, user=wild_text)
    @example(text="\ud800", event_suffix="", user="U0GRACE")
    @example(text="nul \u0000 here", event_suffix="\u0000", user="U0\u0000X")
    def dm(text: str, event_suffix: str, user: str) -> None:
        channel = new_channel("DZ")
        payload = slack_dm(channel, text, event_id=f"Ev{channel}{event_suffix}")
        payload["event"]["user"] = user or "U0GRACE"
        body = json.dumps(payload).encode()
        delivery = Delivery(channel, body)
        sender.deliveries.append(delivery)
        counts["sent"] += 1
        status = sender.attempt(delivery)
        assert isinstance(status, int) and status < 500, (status, body[:300])
        counts["refused"] += status >= 400

    @FUZZ
    @given(payload=json_values)
    def anything(payload: Any) -> None:
        body = json.dumps(payload).encode()
        counts["sent"] += 1
        counts["refused"] += _post(up, "slack", body, sign_slack(body)) >= 400

    dm()
    anything()
    for body in (deep_json(5000), json.dumps(nested(300)).encode(), b"\xff\xfe not json", b"[1, 2]", b""):
        counts["sent"] += 1
        counts["refused"] += _post(up, "slack", body, sign_slack(body)) >= 400

    outcome = sender.wait_all_ran(timeout_s=90)
    accepted = sender.accepted
    doubled = [d.key for d in accepted if outcome.runs(d.key) > 1]
    lost = [d for d in accepted if outcome.runs(d.key) == 0]
    figures.record(
        sent=counts["sent"], accepted=counts["sent"] - counts["refused"], lost=len(lost), duplicated=len(doubled), delayed=0,
        max_delay_s=None, recovery_s=None, bound_s=None,
        note=f"slack: {len(accepted)} accepted DMs each ran once; {counts['refused']} refused with 4xx",
    )
    assert not lost, f"accepted and never run: {[d.body[:200] for d in lost]}"
    assert not doubled


@pytest.mark.parametrize("source", ["github", "jira", "confluence", "mattermost"])
def test_fuzzed_signed_deliveries_to_every_other_webhook_route_are_answered_2xx_or_4xx(
    up: Up, figures: Figures, source: str
) -> None:
    counts = {"sent": 0, "refused": 0}

    def headers_for(body: bytes) -> dict[str, str]:
        if source == "github":
            return {**sign_hub(body, SECRETS["GITHUB_WEBHOOK_SECRET"], "X-Hub-Signature-256"),
                    "X-GitHub-Event": "issue_comment", "X-GitHub-Delivery": str(uuid.uuid4())}
        if source == "mattermost":
            return {"Content-Type": "application/json", "Authorization": f"Token {SECRETS['MATTERMOST_TOKEN']}"}
        secret = SECRETS["JIRA_WEBHOOK_SECRET" if source == "jira" else "CONFLUENCE_WEBHOOK_SECRET"]
        return {**sign_hub(body, secret, "X-Hub-Signature"), "X-Atlassian-Webhook-Identifier": str(uuid.uuid4())}

    @FUZZ
    @given(payload=json_values, event=wild_text)
    @example(payload={"channel_id": "D0\u0000X", "text": "\ud800", "post_id": "p1"}, event="")
    def one(payload: Any, event: str) -> None:
        body = json.dumps(payload).encode()
        query = "?" + urllib.parse.urlencode({"event": event.encode("utf-8", "surrogatepass")}) if source in ("jira", "confluence") else ""
        counts["sent"] += 1
        counts["refused"] += _post(up, source, body, headers_for(body), query) >= 400

    one()
    adf = {"comment": {"body": nested(250)}, "webhookEvent": "comment_created"}
    for body in (deep_json(5000), json.dumps(adf).encode(), b"\xff not json", b"[]"):
        counts["sent"] += 1
        counts["refused"] += _post(up, source, body, headers_for(body)) >= 400
    figures.record(
        sent=counts["sent"], accepted=counts["sent"] - counts["refused"], lost=None, duplicated=None, delayed=None,
        max_delay_s=None, recovery_s=None, bound_s=None, note=f"{source}: only 2xx/4xx",
    )


API_ROUTES = ["/api/events", "/api/turns", "/api/events/series", "/api/dead-letters", "/api/schema/", "/api/seats/"]
API_PARAMS = [
    "category", "type", "seat", "trace_id", "conversation_key", "partition_key", "node", "since", "until",
    "feed_only", "limit", "cursor", "window", "bucket", "version", "format",
]
param_value = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from([
    "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00", "\x00", "%00", "-1", "0", "501", "18446744073709551616",
    "NaN", "1e309", "true", "24h", "0s", "\r\nX-Evil: 1", 'x";filename=evil.html',
])


def test_every_api_parameter_fuzzed_is_answered_2xx_or_4xx(up: Up, figures: Figures) -> None:
    counts = {"sent": 0, "refused": 0}

    def get(path: str) -> None:
        status, answer = request(f"{up.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        counts["sent"] += 1
        counts["refused"] += status >= 400
        assert status < 500, f"GET {path}: {status} {answer[:300]!r}"

    @FUZZ
    @given(route=st.sampled_from(API_ROUTES), params=st.lists(st.tuples(st.sampled_from(API_PARAMS), param_value), max_size=4))
    def query(route: str, params: list[tuple[str, str]]) -> None:
        get(route + "?" + urllib.parse.urlencode(params))

    @FUZZ
    @given(route=st.sampled_from(["/api/events/", "/api/turns/", "/api/traces/"]), ident=param_value)
    def detail(route: str, ident: str) -> None:
        get(route + urllib.parse.quote(ident or "x", safe=""))

    @FUZZ
    @given(path=st.sampled_from(["/operator/act", "/api/seats/linus/pause", "/api/seats/linus/resume"]), payload=json_values)
    @example(path="/operator/act", payload={"tool": "dead_letter_replay", "args": {"ref": "18446744073709551616"}, "request_id": "r"})
    @example(path="/api/seats/linus/pause", payload=[1, 2])
    def post(path: str, payload: Any) -> None:
        status, answer = request(
            f"{up.url}{path}", "POST", json.dumps(payload).encode(),
            {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        counts["sent"] += 1
        counts["refused"] += status >= 400
        assert status < 500, f"POST {path} {payload!r}: {status} {answer[:300]!r}"

    query()
    detail()
    post()
    for deep in (deep_json(5000),):
        for path in ("/operator/act", "/api/seats/linus/pause"):
            status, answer = request(f"{up.url}{path}", "POST", deep, {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            counts["sent"] += 1
            assert status < 500, f"POST {path} 5000-deep: {status} {answer[:200]!r}"
    figures.record(
        sent=counts["sent"], accepted=counts["sent"] - counts["refused"], lost=None, duplicated=None, delayed=None,
        max_delay_s=None, recovery_s=None, bound_s=None, note="/api/ and /operator/act: only 2xx/4xx",
    )
