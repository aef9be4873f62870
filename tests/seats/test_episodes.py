"""Conversation sessions: a turn's episode written for its conversation, given to that conversation's next turn, bounded,
never kept for a trigger without a real conversation, and purged with a retired seat."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from crewlet.company.episodes import EpisodeSettings
from crewlet.company.fields import CompanyError
from crewlet.company.org import CompanyHolder, Organization
from crewlet.company.parse import parse_company
from seats import episodes
from seats.episode_models import Episode
from seats.mailboxes import ensure_mailboxes, retire_absent
from seats.turn_types import Trigger
from seats.turns import TurnRunner
from seats_support import Recorder, company, memory_queues, wake

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "events"]),
    pytest.mark.usefixtures("close_store_connections"),
]

T0 = datetime(2025, 6, 2, 9, 0, tzinfo=timezone.utc)


@sync_to_async
def stored(**where: Any) -> list[Episode]:
    return list(Episode.objects.filter(**where).order_by("written_at", "id"))


def with_episodes(org: Organization, **settings: int) -> Organization:
    return dataclasses.replace(org, episodes=EpisodeSettings(**settings))


async def run(runner: TurnRunner, org: Organization, text: str, conversation: str) -> Trigger:
    seat = org.seat_by_handle("ada")
    assert seat is not None
    trigger = Trigger(events=[wake("ada", text, conversation=conversation)], conversation_key=conversation)
    assert (await runner.run(seat, trigger)).ok
    return trigger


#: The scripted model: every turn answered "noted", so an episode's answer is not an echo of the prompt.
NOTED = [{"kind": "echo", "script": [{"answer": "noted"}]}]


async def test_a_conversations_next_turn_is_given_its_episodes_and_episode_written_follows_the_commit() -> None:
    org = with_episodes(company(providers=NOTED), recent=2, max_bytes=2048)
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org))
        first = await run(runner, org, "when is the deploy?", "slack:D1")
        [row] = await stored(seat="ada", conversation="slack:D1")
        assert (row.turn_id, row.asked, row.answered, row.outcome, row.tools) == (
            first.turn_id, "sam: when is the deploy?", "noted", "completed", [],
        )
        [written] = rec.of("episode_written")
        assert (written.data.episode_id, written.data.turn_id, written.data.conversation_key) == (row.episode_id, first.turn_id, "slack:D1")
        assert rec.types()[-2:] == ["agent_turn_completed", "episode_written"]

        second = await run(runner, org, "and the release notes?", "slack:D1")
        [*_, phase] = rec.of("agent_phase_completed")
        opening = phase.data.user_prompt
        assert opening == "\n".join([
            episodes.BLOCK_OPEN.format(conversation="slack:D1"),
            episodes.render(row),
            f"{episodes.BLOCK_CLOSE}\n\nsam: and the release notes?",
        ])
        assert f"turn {first.turn_id}, completed" in opening and "answered: noted" in opening
        [*_, size] = rec.of("prompt.size")
        assert size.data.user_bytes == len(opening.encode())

        # Another conversation of the same seat is given nothing of this one.
        await run(runner, org, "unrelated", "slack:C9:1718.001")
        [*_, other] = rec.of("agent_phase_completed")
        assert other.data.user_prompt == "sam: unrelated"

        # A turn is given the newest two, oldest first.
        third = await run(runner, org, "third", "slack:D1")
        await run(runner, org, "fourth", "slack:D1")
        [*_, fourth] = rec.of("agent_phase_completed")
        given = fourth.data.user_prompt
        assert f"turn {first.turn_id}" not in given
        assert given.index(f"turn {second.turn_id}") < given.index(f"turn {third.turn_id}")


async def test_a_trigger_without_a_real_conversation_stores_and_reads_nothing() -> None:
    org = company()
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org))
        for conversation in ("", "event:3f2a0d4e-0000-4000-8000-000000000001"):
            await run(runner, org, "hello", conversation)
            await run(runner, org, "again", conversation)
        assert await stored() == [] and rec.of("episode_written") == []
        assert {p.data.user_prompt for p in rec.of("agent_phase_completed")} == {"sam: hello", "sam: again"}
    assert not episodes.remembered("x" * 1001) and episodes.remembered("slack:D1")


async def test_recent_zero_gives_no_episodes_while_they_are_still_written() -> None:
    org = with_episodes(company(), recent=0, max_bytes=2048)
    async with memory_queues() as (_, [q]):
        rec = Recorder().attach(q)
        runner = TurnRunner(q, CompanyHolder(org))
        await run(runner, org, "one", "jira:POC-7")
        await run(runner, org, "two", "jira:POC-7")
        assert [p.data.user_prompt for p in rec.of("agent_phase_completed")] == ["sam: one", "sam: two"]
        assert len(await stored(conversation="jira:POC-7")) == 2


@pytest.mark.parametrize("max_bytes", [256, 700, 2048])
def test_an_episode_is_cut_to_its_size_keeping_the_head_and_sharing_the_rest(max_bytes: int) -> None:
    big = Episode(
        episode_id="e", seat="ada", conversation="slack:D1", turn_id="t" * 64, written_at=T0,
        asked="ä" * 5000, answered="the answer " * 900, outcome="failed", error="boom " * 400,
        tools=[{"name": f"slack__reply_in_thread_{i}", "ok": i % 2 == 0} for i in range(80)],
    )
    fitted = episodes.fitted(big, max_bytes)
    text = episodes.render(fitted)
    assert len(text.encode()) <= max_bytes
    assert fitted.tools[-1]["name"].startswith("…and ") and "asked: " in text and "answered: " in text
    small = episodes.fitted(Episode(turn_id="t", written_at=T0, asked="short ask", answered="x" * 4000, outcome="completed"), 700)
    assert small.asked == "short ask" and 400 < len(episodes.render(small).encode()) <= 700


async def test_a_conversation_keeps_its_newest_episodes_and_a_retired_seat_loses_all_of_its() -> None:
    for i in range(episodes.KEPT_PER_CONVERSATION + 3):
        await episodes.awrite(Episode(
            episode_id=f"linus-{i}", seat="linus", conversation="slack:D2", turn_id=f"t{i}",
            outcome="completed", written_at=T0 + timedelta(seconds=i),
        ))
    await episodes.awrite(Episode(episode_id="ada-1", seat="ada", conversation="slack:D2", turn_id="a1", outcome="completed"))
    kept = await stored(seat="linus")
    assert len(kept) == episodes.KEPT_PER_CONVERSATION and kept[0].episode_id == "linus-3"
    assert [e.turn_id for e in await episodes.arecent("linus", "slack:D2", 2)] == [
        f"t{episodes.KEPT_PER_CONVERSATION + 1}", f"t{episodes.KEPT_PER_CONVERSATION + 2}",
    ]
    async with memory_queues() as (_, [q]):
        await ensure_mailboxes(q, company(), now=T0)
        without_linus = company(seats=[{"handle": "ada", "kind": "agent"}, {"handle": "grace", "kind": "human"}])
        await retire_absent(q, without_linus, now=T0)
        report = await retire_absent(q, without_linus, now=T0 + timedelta(hours=24))
    assert report.retired == ["linus"] and report.episodes_purged == episodes.KEPT_PER_CONVERSATION
    assert await stored(seat="linus") == [] and [e.episode_id for e in await stored(seat="ada")] == ["ada-1"]


def test_the_company_files_episodes_key_has_defaults_and_refuses_a_value_out_of_range() -> None:
    base = {"org": "acme", "seats": [{"handle": "ada", "kind": "agent"}]}
    assert parse_company(base).episodes == EpisodeSettings(recent=5, max_bytes=2048)
    assert parse_company({**base, "episodes": {"recent": 0, "max_bytes": 256}}).episodes == EpisodeSettings(0, 256)
    for value, field, rule in (
        ({"recent": 21}, "episodes.recent", "between 0 and 20"),
        ({"max_bytes": 100}, "episodes.max_bytes", "between 256 and 16384"),
        ({"keep": 3}, "episodes.keep", "unknown key"),
    ):
        with pytest.raises(CompanyError) as refused:
            parse_company({**base, "episodes": value})
        assert field in str(refused.value) and rule in str(refused.value)
