"""The chat working indicator: set as a turn starts, cleared as it ends, best-effort, against local vendor APIs.

The indicators run in-process here (no engine, no model): a wake as the
notification service publishes it, the seat's company with its grant of the
shipped chat server, and the vendor's API on loopback. The same indicator
through a real ``manage.py up`` is ``test_chat_reply_up.py``.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Iterator

import pytest

from chat_vendor_support import CallLog, MattermostApi, SlackWebApi, mattermost_api, slack_web_api
from crewlet.company.conf import ToolSettings
from crewlet.company.org import Organization, Seat
from crewlet.company.parse import parse_company
from crewlet.events import Event, new
from crewlet.events.trace import Trace
from crewlet.events.types import ExternalNotification, TaskAssigned
from seats.hooks import TurnHooks, begin_turn
from seats.indicator import ChatTarget, WorkingIndicators, target_of
from seats.turn_types import Trigger
from waiting_support import eventually

SLACK_TOKEN = "xoxb-ada-indicator"
MM_TOKEN = "ada-mm-indicator"
#: Shrunk so the typing event's repeats are seen in tenths of a second.
SETTINGS = ToolSettings(indicator_timeout_s=10.0, typing_every_s=0.05)


def chat_wake(source: str, partition_key: str, message_id: str) -> Event:
    """A wake as the router publishes one for a chat message (``notifications.service.NotifyRouter.wake``)."""
    extras = {"sender": "grace", "body": "@ada please look", "partition_key": partition_key,
              "conversation_identity": partition_key, "message_id": message_id, "delivery_id": message_id}
    return new(ExternalNotification(seat="ada", sender="grace", body="@ada please look"), Trace.root(), source=source, extras=extras)


def trigger_of(event: Event) -> Trigger:
    return Trigger(events=[event], partition_key=str(event.field("partition_key") or ""))


@pytest.fixture
def log() -> CallLog:
    return CallLog()


@pytest.fixture
def slack(log: CallLog) -> Iterator[SlackWebApi]:
    with slack_web_api(log, {SLACK_TOKEN}) as api:
        yield api


@pytest.fixture
def mattermost(log: CallLog) -> Iterator[MattermostApi]:
    with mattermost_api(log, {MM_TOKEN: "adabotuser"}) as api:
        yield api


def company(slack_url: str = "http://127.0.0.1:9/api/", mm_url: str = "http://127.0.0.1:9", tools: tuple[str, ...] = ("slack", "mm")) -> tuple[Organization, Seat]:
    org = parse_company(
        {
            "org": "acme",
            "surfaces": {"slack": {"api_url": slack_url}, "mattermost": {"server": mm_url}},
            "mcp_servers": {"slack": {"builtin": "slack"}, "mm": {"builtin": "mattermost"}},
            "seats": [{"handle": "ada", "kind": "agent", "tools": list(tools)}],
        }
    )
    seat = org.seat_by_handle("ada")
    assert seat is not None
    return org, seat


def indicators() -> WorkingIndicators:
    return WorkingIndicators(SETTINGS, environ={"SLACK_BOT_TOKEN": SLACK_TOKEN, "MATTERMOST_BOT_TOKEN": MM_TOKEN})


# -- which message, which thread ---------------------------------------------------------------


@pytest.mark.parametrize(
    "source, key, message, target",
    [
        ("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000200",
         ChatTarget("slack", "C0DEV", "1718000000.000200", "1718000000.000100")),
        ("slack", "slack:D0ADA", "D0ADA:1718000000.000300", ChatTarget("slack", "D0ADA", "1718000000.000300", "")),
        ("slack", "", "command:13345224609.738474", None),  # a slash command: no message of its own
        ("slack", "slack:C0DEV:1718000000.000100", "action:EvCLICK", None),  # a click on a message
        ("mattermost", "mattermost:chan0dev:rootpost0", "replypost0", ChatTarget("mattermost", "chan0dev", "replypost0", "rootpost0")),
        ("mattermost", "mattermost:dmchan0", "dmpost0", ChatTarget("mattermost", "dmchan0", "dmpost0", "")),
        ("github", "github:acme/app:issue:7", "123", None),
    ],
)
def test_the_target_is_the_triggering_message_in_the_thread_its_partition_names(
    source: str, key: str, message: str, target: Any
) -> None:
    assert target_of(trigger_of(chat_wake(source, key, message))) == target


def test_a_scheduled_task_is_no_chat_message_and_shows_nothing() -> None:
    task = new(TaskAssigned(seat="ada", title="standup", instructions="post the standup"), Trace.root(), source="scheduler")
    assert target_of(Trigger(events=[task])) is None


# -- Slack: a reaction on the message ---------------------------------------------------------------


async def test_on_slack_the_eyes_reaction_is_added_as_the_turn_starts_and_removed_as_it_ends_with_the_seats_token(
    slack: SlackWebApi, log: CallLog
) -> None:
    org, ada = company(slack_url=slack.url)
    running = indicators()
    slack.gate = threading.Event()  # Slack has not answered yet
    end = running.begin(org, ada, trigger_of(chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000200")))
    assert end is not None and log.calls == []  # the turn goes on without waiting for Slack
    slack.gate.set()
    await eventually(lambda: log.of("slack", "reactions.add"), what="the reaction added")
    assert log.of("slack", "reactions.remove") == []  # shown while the turn runs
    end()
    await eventually(lambda: running.running() == 0, what="the indicator cleared")
    (added,) = log.of("slack", "reactions.add")
    (removed,) = log.of("slack", "reactions.remove")
    for call in (added, removed):
        assert call.token == SLACK_TOKEN
        assert call.args == {"channel": "C0DEV", "timestamp": "1718000000.000200", "name": "eyes"}
    assert added.seq < removed.seq


async def test_a_slack_refusal_is_logged_once_for_the_turn_and_nothing_is_removed(
    slack: SlackWebApi, log: CallLog, caplog: pytest.LogCaptureFixture
) -> None:
    org, ada = company(slack_url=slack.url)
    slack.fail["reactions.add"] = "missing_scope"
    running = indicators()
    with caplog.at_level(logging.DEBUG, logger="crewlet.seats.indicator"):
        end = running.begin(org, ada, trigger_of(chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000100")))
        assert end is not None
        await eventually(lambda: log.of("slack", "reactions.add"), what="the refused reaction")
        end()
        await eventually(lambda: running.running() == 0, what="the indicator done")
    failed = [r for r in caplog.records if r.getMessage() == "working_indicator_failed"]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert (failed[0].seat, failed[0].surface, failed[0].call) == ("ada", "slack", "reactions.add")  # type: ignore[attr-defined]
    assert failed[0].error == "Slack refused reactions.add: missing_scope (the bot needs the scope reactions:write)"  # type: ignore[attr-defined]
    assert log.of("slack", "reactions.remove") == []


async def test_the_token_is_the_one_the_seats_grant_maps_the_servers_token_to(slack: SlackWebApi, log: CallLog) -> None:
    org = parse_company(
        {
            "org": "acme",
            "surfaces": {"slack": {"api_url": slack.url}},
            "mcp_servers": {"slack": {"builtin": "slack"}},
            "seats": [{"handle": "ada", "kind": "agent",
                       "tools": [{"server": "slack", "env": {"SLACK_BOT_TOKEN": "ADA_SLACK_BOT_TOKEN"}}]}],
        }
    )
    ada = org.seat_by_handle("ada")
    assert ada is not None
    running = WorkingIndicators(SETTINGS, environ={"SLACK_BOT_TOKEN": "xoxb-shared", "ADA_SLACK_BOT_TOKEN": SLACK_TOKEN})
    end = running.begin(org, ada, trigger_of(chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000100")))
    assert end is not None
    end()
    await eventually(lambda: running.running() == 0, what="the indicator done")
    assert [c.token for c in log.calls] == [SLACK_TOKEN, SLACK_TOKEN]  # added and removed with ada's own


async def test_a_seat_granted_no_slack_server_shows_nothing_there(slack: SlackWebApi, log: CallLog) -> None:
    org, ada = company(slack_url=slack.url, tools=("mm",))
    assert indicators().begin(org, ada, trigger_of(chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000100"))) is None
    assert WorkingIndicators(SETTINGS, environ={}).begin(*company(slack_url=slack.url), trigger_of(  # granted, no token set
        chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000100"))) is None
    assert log.calls == []


# -- Mattermost: the typing event in the thread ---------------------------------------------------------------


async def test_on_mattermost_the_typing_event_is_sent_in_the_thread_while_the_turn_runs_and_stops_with_it(
    mattermost: MattermostApi, log: CallLog
) -> None:
    org, ada = company(mm_url=mattermost.url)
    running = indicators()
    end = running.begin(org, ada, trigger_of(chat_wake("mattermost", "mattermost:chan0dev:rootpost0", "replypost0")))
    assert end is not None
    await eventually(lambda: len(log.of("mattermost", "/users/me/typing")) >= 3, what="typing sent again while the turn runs")
    end()
    await eventually(lambda: running.running() == 0, what="the indicator ended")
    sent = log.of("mattermost", "/users/me/typing")
    assert {(c.verb, c.token) for c in sent} == {("POST", MM_TOKEN)}
    assert {tuple(sorted(c.args.items())) for c in sent} == {(("channel_id", "chan0dev"), ("parent_id", "rootpost0"))}
    await running.stop()
    assert len(log.of("mattermost", "/users/me/typing")) == len(sent)  # nothing after the turn's end


async def test_a_refused_typing_event_is_logged_once_per_turn_however_often_it_is_sent(
    mattermost: MattermostApi, log: CallLog, caplog: pytest.LogCaptureFixture
) -> None:
    org, ada = company(mm_url=mattermost.url)
    mattermost.fail["/users/me/typing"] = 403
    running = indicators()
    with caplog.at_level(logging.INFO, logger="crewlet.seats.indicator"):
        end = running.begin(org, ada, trigger_of(chat_wake("mattermost", "mattermost:dmchan0", "dmpost0")))
        assert end is not None
        await eventually(lambda: len(log.of("mattermost", "/users/me/typing")) >= 3, what="typing tried again")
        end()
        await eventually(lambda: running.running() == 0, what="the indicator ended")
    (failed,) = [r for r in caplog.records if r.getMessage() == "working_indicator_failed"]
    assert failed.error == "Mattermost refused typing: HTTP 403: You do not have the appropriate permissions."  # type: ignore[attr-defined]
    assert {tuple(sorted(c.args.items())) for c in log.of("mattermost", "/users/me/typing")} == {(("channel_id", "dmchan0"),)}


# -- the around-turn hooks themselves ---------------------------------------------------------------


def test_a_failing_around_turn_hook_is_logged_and_the_others_still_start_and_end_in_reverse(caplog: pytest.LogCaptureFixture) -> None:
    org, ada = company()
    seen: list[str] = []

    def first(o: Organization, s: Seat, t: Trigger) -> Any:
        seen.append("start first")
        return lambda: seen.append("end first")

    def broken(o: Organization, s: Seat, t: Trigger) -> Any:
        raise RuntimeError("the hook's own bug")

    def last(o: Organization, s: Seat, t: Trigger) -> Any:
        seen.append("start last")
        return lambda: seen.append("end last")

    with caplog.at_level(logging.ERROR, logger="crewlet.seats.hooks"):
        end = begin_turn(TurnHooks.of(around_turn=[first, broken, last]), org, ada, Trigger(events=[]))
        end()
    assert seen == ["start first", "start last", "end last", "end first"]
    assert [r.getMessage() for r in caplog.records] == ["seat_around_turn_hook_failed"]


async def test_a_stopping_node_starts_no_indicator_and_lets_the_one_clearing_finish(slack: SlackWebApi, log: CallLog) -> None:
    org, ada = company(slack_url=slack.url)
    running = indicators()
    wake = chat_wake("slack", "slack:C0DEV:1718000000.000100", "C0DEV:1718000000.000100")
    end = running.begin(org, ada, trigger_of(wake))
    assert end is not None
    await eventually(lambda: log.of("slack", "reactions.add"), what="the reaction added")
    end()
    await asyncio.wait_for(running.stop(), timeout=30)
    assert len(log.of("slack", "reactions.remove")) == 1
    assert running.begin(org, ada, trigger_of(wake)) is None
