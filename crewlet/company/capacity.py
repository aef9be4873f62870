"""Whether a company fits the broker: room for every agent seat's mailboxes within ``stream.max_consumers``.

A seat's mailboxes are durable consumers on ``CREWLET_AGENT``: its inbox,
made for every agent seat before any is claimed, and its control mailbox,
made when a run of the seat first needs it. The broker refuses a consumer
past the stream's limit, and a refusal met half-way through the walk that
makes the inboxes would leave a company some of whose seats can receive
mail and some cannot. So a company is held to the limit before anything is
made — at start, before the engine runs, and before an applied revision is
served — with room for both mailboxes of every seat, so no run is refused
its control mailbox later either.
"""
from __future__ import annotations

from crewlet.company.conf import SettingsError
from crewlet.company.org import Organization
from crewlet.queue import topics

#: Durable consumers an agent seat may hold on CREWLET_AGENT: its inbox, and its control mailbox while a run is open.
CONSUMERS_PER_AGENT_SEAT = 2
#: The setting a refusal names, and where an operator raises it.
LIMIT_FIELD = "stream.max_consumers"
LIMIT_ENV = "CREWLET_STREAM_MAX_CONSUMERS"


def consumers_needed(org: Organization) -> int:
    """The durable consumers ``org``'s agent seats may hold on the agent stream at once."""
    return CONSUMERS_PER_AGENT_SEAT * len(org.agent_seats())


def check_fits(org: Organization, max_consumers: int) -> None:
    """Refuse ``org`` in one line when its seats' mailboxes would not fit under ``max_consumers``."""
    needed = consumers_needed(org)
    if needed <= max_consumers:
        return
    seats = len(org.agent_seats())
    raise SettingsError(
        LIMIT_FIELD, max_consumers,
        f"a company of {seats} agent seats needs room for {needed} durable consumers on {topics.AGENT_STREAM.name} "
        f"(each seat's inbox and control mailbox); raise {LIMIT_FIELD} ({LIMIT_ENV}) to at least {needed}, "
        "or run fewer agent seats",
    )


__all__ = ["CONSUMERS_PER_AGENT_SEAT", "check_fits", "consumers_needed"]
