"""Conformance: listing durable subscriptions (docs/design.md § Listing), on every backend.

Design: docs/design.md § Delivery semantics ("Every durable subscription can
be listed"). A listing answers which subscriptions the broker holds under a
topic pattern, attached or not, whichever client made them, as the exact pair
each was created with.
"""
from __future__ import annotations

import pytest

from crewlet.queue.contract import BatchOptions, SubscriptionRef
from crewlet.queue.errors import InvalidArgument
from crewlet.queue.queuetest.harness import Collector, inbox, state, uniq


def refs(*pairs):
    return sorted(SubscriptionRef(t, g) for t, g in pairs)


def mine(listed, marker):
    """The listed refs this case made (a shared broker may hold others)."""
    return [r for r in listed if marker in r.topic or marker in r.group]


async def test_every_durable_subscription_is_listed_attached_or_not_however_it_was_made(harness, queue):
    h = uniq("seat")
    ensured = (f"crewlet.agent.{h}.inbox", f"agent-{h}")
    subscribed = (f"crewlet.agent.{h}.control", f"agent-{h}-control")
    batched = (f"crewlet.agent.{h}.reflect", f"agent-{h}-reflect")
    await queue.ensure_subscription(*ensured)
    await queue.subscribe(*subscribed, Collector(harness))
    await queue.subscribe_batch(*batched, BatchOptions(), Collector(harness))
    listed = await queue.list_subscriptions(f"crewlet.agent.{h}.>")
    assert listed == refs(ensured, subscribed, batched)
    assert all(isinstance(r, SubscriptionRef) for r in listed)


async def test_a_detached_subscription_stays_listed_and_a_deleted_one_does_not(harness, queue):
    h = uniq("seat")
    kept = (f"crewlet.agent.{h}.inbox", f"agent-{h}")
    doomed = (f"crewlet.agent.{h}.control", f"agent-{h}-control")
    sub = await queue.subscribe(*kept, Collector(harness))
    await queue.subscribe(*doomed, Collector(harness))
    assert await sub.detach() is True
    assert await queue.delete_subscription(*doomed) is True
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.>") == refs(kept)
    assert await queue.delete_subscription(*kept) is True
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.>") == []


async def test_a_broadcast_subscription_is_never_listed(harness, queue):
    h = uniq("seat")
    durable = (f"crewlet.agent.{h}.inbox", f"agent-{h}")
    await queue.ensure_subscription(*durable)

    async def ignore(_subject, _event):
        return None

    events_topic = f"crewlet.events.{h}"
    await queue.subscribe_stream(f"crewlet.agent.{h}.>", ignore)
    await queue.subscribe_stream(events_topic, ignore)
    await queue.subscribe_stream("crewlet.events.>", ignore)
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.>") == refs(durable)
    assert await queue.list_subscriptions(events_topic) == []
    assert mine(await queue.list_subscriptions(">"), h) == refs(durable)


async def test_the_pattern_filters_with_the_subject_grammar(harness, queue):
    marker = uniq("grammar")
    h1, h2 = f"{marker}a", f"{marker}b"
    inbox1 = (f"crewlet.agent.{h1}.inbox", f"agent-{h1}")
    inbox1_second_group = (f"crewlet.agent.{h1}.inbox", f"audit-{h1}")
    control1 = (f"crewlet.agent.{h1}.control", f"agent-{h1}-control")
    deep1 = (f"crewlet.agent.{h1}.x.y", f"deep-{h1}")
    inbox2 = (f"crewlet.agent.{h2}.inbox", f"agent-{h2}")
    for pair in (inbox1, inbox1_second_group, control1, deep1, inbox2):
        assert await queue.ensure_subscription(*pair) is True

    async def listed(pattern):
        return mine(await queue.list_subscriptions(pattern), marker)

    # a literal pattern is that topic exactly, every group of it
    assert await listed(f"crewlet.agent.{h1}.inbox") == refs(inbox1, inbox1_second_group)
    assert await listed(f"crewlet.agent.{h1}") == [], "a literal matches no deeper subject"
    # '*' matches exactly one token
    assert await listed(f"crewlet.agent.{h1}.*") == refs(inbox1, inbox1_second_group, control1)
    assert await listed("crewlet.agent.*.inbox") == refs(inbox1, inbox1_second_group, inbox2)
    assert await listed(f"crewlet.agent.{h1}.*.y") == refs(deep1)
    assert await listed(f"crewlet.agent.{h1}.*.*.*") == []
    # '>' matches one or more trailing tokens
    assert await listed(f"crewlet.agent.{h1}.>") == refs(inbox1, inbox1_second_group, control1, deep1)
    assert await listed(f"crewlet.agent.{h1}.x.>") == refs(deep1)
    assert await listed(f"crewlet.agent.{h1}.x.y.>") == []
    assert await listed("crewlet.agent.>") == refs(inbox1, inbox1_second_group, control1, deep1, inbox2)


async def test_a_pattern_of_a_lone_wildcard_lists_every_namespace(harness, queue):
    marker = uniq("every")
    pairs = [
        (f"crewlet.agent.{marker}.inbox", f"agent-{marker}"),
        ("crewlet.notifications.inbound", f"notify-{marker}"),
        (f"crewlet.events.{marker}", f"materializer-{marker}"),
        ("crewlet.config.revision_activated", f"config-{marker}"),
        (f"{marker}.work", "custom-namespace"),
    ]
    for pair in pairs:
        assert await queue.ensure_subscription(*pair) is True
    assert mine(await queue.list_subscriptions(">"), marker) == refs(*pairs)
    assert mine(await queue.list_subscriptions("*.>"), marker) == refs(*pairs)
    assert mine(await queue.list_subscriptions("crewlet.>"), marker) == refs(*pairs[:4])
    assert mine(await queue.list_subscriptions(f"{marker}.*"), marker) == refs(pairs[4])


async def test_an_empty_or_malformed_pattern_is_refused_and_changes_nothing(harness, queue):
    topic, group = inbox()
    await queue.ensure_subscription(topic, group)
    before = await state(queue, (topic, group))
    for pattern in ("", " ", "crewlet.>.inbox", "crewlet..agent", "crewlet.agent.", "crewlet.ag*"):
        with pytest.raises(InvalidArgument):
            await queue.list_subscriptions(pattern)
    assert await state(queue, (topic, group)) == before


async def test_the_pair_comes_back_exactly_as_created(harness, queue):
    h = uniq("seat")
    topics_ = [f"crewlet.agent.{h}.a.b", f"crewlet.agent.{h}.a_b"]
    groups = ["h.i", "h_i", "h i", "h-i", "seat with spaces", "Grüße-ü"]
    pairs = [(t, g) for t in topics_ for g in groups]
    for pair in pairs:
        assert await queue.ensure_subscription(*pair) is True, f"{pair} aliased an earlier pair"
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.>") == refs(*pairs)
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.a.b") == refs(*[p for p in pairs if p[0] == topics_[0]])
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.a_b") == refs(*[p for p in pairs if p[0] == topics_[1]])
    # the listed pair is the one to act on: deleting by it deletes exactly that one
    assert await queue.delete_subscription(topics_[0], "h.i") is True
    remaining = [p for p in pairs if p != (topics_[0], "h.i")]
    assert await queue.list_subscriptions(f"crewlet.agent.{h}.>") == refs(*remaining)


async def test_another_client_lists_what_this_one_created(harness, queue):
    h = uniq("seat")
    pairs = [(f"crewlet.agent.{h}.inbox", f"agent-{h}"), (f"crewlet.agent.{h}.control", "h.i ctl")]
    await queue.ensure_subscription(*pairs[0])
    await queue.subscribe(*pairs[1], Collector(harness))
    other = await harness.client("n2")
    assert await other.list_subscriptions(f"crewlet.agent.{h}.>") == refs(*pairs)
    await queue.close()
    assert await other.list_subscriptions(f"crewlet.agent.{h}.>") == refs(*pairs), "the broker's, not the client's"
