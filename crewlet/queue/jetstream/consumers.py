"""Durable consumers: created, aligned, deleted, listed by their metadata, and pulled from."""
from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Optional

import nats.errors

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import SubscriptionRef
from crewlet.queue.errors import ConsumerLimit, Unavailable
from crewlet.queue.jetstream.configs import META_GROUP, META_TOPIC, consumer_config, durable_name
from crewlet.queue.jetstream.pull import JetStreamPuller
from crewlet.queue.jetstream.streams import StreamsPart
from crewlet.queue.jetstream.wire import (
    _NATS_ERRORS,
    _NS,
    ERR_CONSUMER_EXISTS,
    ERR_CONSUMER_NOT_FOUND,
    ERR_MAX_CONSUMERS,
    ERR_STREAM_NOT_FOUND,
    NUM_PENDING_HEADER,
    _ApiError,
    _status_of,
    count_request,
    direct_get_subject,
)

logger = logging.getLogger(__name__)


class ConsumersPart(StreamsPart):
    """A seat's mailbox on the broker: one durable pull consumer per (topic, group)."""

    # -- durable consumers -----------------------------------------------------------

    async def ensure_consumer(self, topic: str, group: str) -> bool:
        """Create the durable for (topic, group) unless it exists (aligning its ack window); True when this call made it.

        A clustered member starting may ask before the cluster can answer
        about its consumers: an ask that timed out or went unanswered is made
        again within provisioning's window (:meth:`_asked_until_settled`); a
        refusal the broker did answer stands at once.
        """
        return await self._asked_until_settled(
            lambda: self._ensure_consumer_once(topic, group),
            "jetstream_consumer_waiting",
            {"topic": topic, "group": group},
            since=asyncio.get_running_loop().time(),
            answered_refusals_stand=True,
        )

    async def _ensure_consumer_once(self, topic: str, group: str) -> bool:
        spec = self._stream_of(topic)
        await self._ensure_stream(spec)
        name = durable_name(topic, group)
        try:
            info = await self._consumer_info(spec.name, name)
        except _ApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                await self._ensure_stream(spec, force=True)
            elif e.err_code != ERR_CONSUMER_NOT_FOUND:
                raise
        else:
            await self._align_ack_wait(spec.name, name, info.get("config") or {})
            return False
        cfg = consumer_config(topic, group, self.timings)
        # A per-call nonce: of two racing creators exactly one gets "created"
        # (the broker refuses an action=create whose config differs).
        cfg["description"] = f"crewlet mailbox #{secrets.token_hex(6)}"
        try:
            await self._api(
                f"CONSUMER.CREATE.{spec.name}.{name}",
                {"stream_name": spec.name, "config": cfg, "action": "create"},
                what=f"create consumer {name}",
            )
        except _ApiError as e:
            if e.err_code == ERR_CONSUMER_EXISTS:
                return False
            if e.err_code == ERR_MAX_CONSUMERS:
                raise ConsumerLimit(
                    f"stream.max_consumers={self.max_consumers}: the broker refused consumer {name} on {spec.name} "
                    f"({e.description}); raise stream.max_consumers (CREWLET_STREAM_MAX_CONSUMERS), or the account's "
                    "consumer limit on an external server"
                ) from e
            raise
        logger.info(
            "jetstream_consumer_created",
            extra={"stream": spec.name, "consumer": name, "topic": topic, "group": group},
        )
        return True

    async def _align_ack_wait(self, stream: str, name: str, current: dict[str, Any]) -> None:
        """Give an existing durable this client's ack window (one made with another keeps it otherwise).

        Only the ack window is aligned: it is what decides how long a dead
        process's mail waits, and the broker lets it change in place. The
        rest of the consumer (its position, its metadata, its nonce) is kept
        as it is, and a refusal leaves the consumer as it was.
        """
        want = int(float(self.timings.ack_wait_s) * _NS)
        have = current.get("ack_wait")
        if not current or have == want:
            return
        cfg = dict(current)
        cfg["ack_wait"] = want
        try:
            await self._api(
                f"CONSUMER.CREATE.{stream}.{name}",
                {"stream_name": stream, "config": cfg, "action": "update"},
                what=f"update consumer {name}",
            )
        except _ApiError as e:
            logger.warning(
                "jetstream_consumer_config_kept",
                extra={"stream": stream, "consumer": name, "ack_wait_s": (have or 0) / _NS, "error": e.description},
            )
            return
        logger.info(
            "jetstream_consumer_updated",
            extra={"stream": stream, "consumer": name, "ack_wait_s_was": (have or 0) / _NS, "ack_wait_s": want / _NS},
        )

    async def delete_consumer(self, topic: str, group: str) -> bool:
        spec = self._stream_of(topic)
        name = durable_name(topic, group)
        try:
            resp = await self._api(f"CONSUMER.DELETE.{spec.name}.{name}", None, what=f"delete consumer {name}")
        except _ApiError as e:
            if e.no_consumer:
                return False
            raise
        deleted = bool(resp.get("success"))
        if deleted:
            logger.info("jetstream_consumer_deleted", extra={"stream": spec.name, "consumer": name})
        return deleted

    async def _list_streams(self, pattern: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            resp = await self._api("STREAM.LIST", {"offset": offset, "subject": pattern}, what="list streams")
            streams = resp.get("streams") or []
            out.extend(streams)
            offset += len(streams)
            if not streams or offset >= int(resp.get("total", 0) or 0):
                return out

    async def _list_consumers_of(self, stream: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            try:
                resp = await self._api(f"CONSUMER.LIST.{stream}", {"offset": offset}, what=f"list consumers of {stream}")
            except _ApiError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    return out
                raise
            consumers = resp.get("consumers") or []
            out.extend(consumers)
            offset += len(consumers)
            if not consumers or offset >= int(resp.get("total", 0) or 0):
                return out

    async def list_consumers(self, pattern: str) -> list[SubscriptionRef]:
        topics.validate_pattern(pattern)
        refs: set[SubscriptionRef] = set()
        for info in await self._list_streams(pattern):
            cfg = info.get("config") or {}
            stream = str(cfg.get("name", ""))
            subjects = cfg.get("subjects") or []
            if not stream.startswith(topics.STREAM_PREFIX):
                continue  # another application's stream on a shared account
            if not any(topics.overlaps(s, pattern) for s in subjects):
                continue
            for ci in await self._list_consumers_of(stream):
                ccfg = ci.get("config") or {}
                name = str(ci.get("name", ""))
                if not ccfg.get("durable_name"):
                    continue  # ephemeral (broadcast) consumers are never subscriptions
                meta = ccfg.get("metadata") or {}
                topic, group = meta.get(META_TOPIC), meta.get(META_GROUP)
                if (
                    not isinstance(topic, str)
                    or not isinstance(group, str)
                    or ccfg.get("durable_name") != name
                    or durable_name(topic, group) != name
                ):
                    logger.warning(
                        "jetstream_subscription_unnamed",
                        extra={"stream": stream, "consumer": name, "meta_topic": topic, "meta_group": group},
                    )
                    continue
                if topics.matches(pattern, topic):
                    refs.add(SubscriptionRef(topic, group))
        return sorted(refs)

    async def consumer_info(self, topic: str, group: str) -> Optional[dict[str, Any]]:
        """The broker's view of the durable (topic, group), or None when it does not exist."""
        spec = self._stream_of(topic)
        try:
            return await self._consumer_info(spec.name, durable_name(topic, group))
        except _ApiError as e:
            if e.no_consumer:
                return None
            raise

    async def backlog(self, topic: str, group: str) -> int:
        """What waits for (topic, group): the mail not yet delivered plus the mail delivered and not yet settled.

        The consumer's own ``num_pending`` is a running count the broker
        moves after it has acknowledged a publish (its stream signals its
        consumers from a queue of its own), so a read right behind a publish
        can miss it. The undelivered part is therefore also counted in the
        stream's store from the consumer's delivered sequence on, and the
        larger of the two stands: a publish that returned is always counted.
        """
        info = await self.consumer_info(topic, group)
        if info is None:
            return 0
        running = int(info.get("num_pending", 0) or 0)
        delivered = int((info.get("delivered") or {}).get("stream_seq", 0) or 0)
        stored = await self._stored_from(self._stream_of(topic).name, topic, delivered + 1)
        return max(running, stored) + int(info.get("num_ack_pending", 0) or 0)

    async def _stored_from(self, stream: str, subject: str, from_seq: int) -> int:
        """How many messages on ``subject`` ``stream`` holds from ``from_seq`` on, counted in its store.

        One batched direct get: the first such message plus its
        ``Nats-Num-Pending``; a 404 is none. A stream that does not answer
        direct gets (provisioned by an older build, its update refused)
        counts 0, leaving the consumer's running count to stand.
        """
        self._require_connected()
        try:
            msg = await keeping_cancel(
                self._nc.request(direct_get_subject(stream), count_request(subject, from_seq), timeout=self._api_timeout_s)
            )
        except nats.errors.NoRespondersError:
            return 0
        except _NATS_ERRORS as e:
            raise Unavailable(f"counting the stored mail of {subject!r} failed: {e!r}") from e
        status, description = _status_of(msg)
        if status == "404":
            return 0
        if status:
            raise Unavailable(f"counting the stored mail of {subject!r}: {status} {description}")
        try:
            after = int((msg.headers or {}).get(NUM_PENDING_HEADER, "0") or 0)
        except ValueError as e:
            raise Unavailable(f"counting the stored mail of {subject!r}: unreadable {NUM_PENDING_HEADER}") from e
        return 1 + after

    async def open_puller(self, topic: str, group: str) -> JetStreamPuller:
        spec = self._stream_of(topic)
        self._require_connected()
        puller = JetStreamPuller(self, spec.name, durable_name(topic, group), topic, group)
        try:
            await puller._open_sub()
        except _NATS_ERRORS as e:
            raise Unavailable(f"cannot open a puller on {topic!r}: {e!r}") from e
        self._pullers.add(puller)
        return puller
