"""Stream provisioning (the topology of ``crewlet.queue.topics``) and publishing into it."""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any, Awaitable, Callable, Mapping, Optional, TypeVar

import nats.errors

from crewlet.base.aio import keeping_cancel
from crewlet.queue import topics
from crewlet.queue.contract import MAX_PAYLOAD_BYTES
from crewlet.queue.errors import InvalidArgument, ReplicasUnplaceable, TooLarge, Unavailable, Unconfirmed
from crewlet.queue.jetstream.base import TransportBase
from crewlet.queue.jetstream.configs import stream_config
from crewlet.queue.jetstream.wire import (
    _NATS_ERRORS,
    _NS,
    ERR_MESSAGE_TOO_LARGE,
    ERR_NO_SUITABLE_PEERS,
    ERR_REPLICAS_NOT_SUPPORTED,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    _acked_seq,
    _ApiError,
)
from crewlet.queue.transport import H_MSG_ID

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: While a starting cluster cannot place or answer about a stream yet: how often it is asked again, and said so.
PROVISION_ASK_EVERY_S = 0.5
PROVISION_PROGRESS_EVERY_S = 3.0

#: Stream settings provisioning keeps aligned with the topology (others are the broker's defaults).
_ALIGNED_KEYS = frozenset(
    {
        "subjects",
        "retention",
        "storage",
        "max_age",
        "max_msgs_per_subject",
        "max_msg_size",
        "num_replicas",
        "discard",
        "allow_direct",
        "max_consumers",
    }
)


class StreamsPart(TransportBase):
    """Streams created and aligned on demand, and publishing with a stream under every subject."""

    # -- streams ----------------------------------------------------------------------

    def stream_config(self, spec: topics.StreamSpec) -> dict[str, Any]:
        return stream_config(
            spec,
            event_retention_hours=self.event_retention_hours,
            memory_storage=self.memory_storage,
            replicas=self.replicas,
            max_consumers=self.max_consumers,
        )

    async def provision(self) -> None:
        """Create (or align) every engine stream; idempotent.

        With ``provision_wait_s`` (a clustered member starting), a stream the
        cluster cannot place yet (its copies' members still arriving) or
        answer about in time (a leader being elected, the meta layer busy
        with every node's streams at once) is asked for again every
        ``PROVISION_ASK_EVERY_S`` until that deadline: members announce
        themselves only on the system account, so there is no event to wait on.
        """
        started = asyncio.get_running_loop().time()
        self._settle_until = started + self.provision_wait_s
        for spec in topics.ENGINE_STREAMS:
            try:
                await self._asked_until_settled(
                    lambda: self._ensure_stream(spec), "jetstream_provision_waiting", {"stream": spec.name}, since=started
                )
            except ReplicasUnplaceable as e:
                logger.error("jetstream_stream_replicas_unplaceable", extra={"stream": spec.name, "error": str(e)})
                raise

    async def _asked_until_settled(
        self,
        ask: Callable[[], Awaitable[T]],
        waiting: str,
        about: dict[str, Any],
        *,
        since: float,
        answered_refusals_stand: bool = False,
    ) -> T:
        """``ask()``, made again every ``PROVISION_ASK_EVERY_S`` while it fails and provisioning's window is open.

        The window (``provision_wait_s`` from provisioning's start) is a
        clustered member starting: the cluster may not yet place or answer
        about a stream or a consumer (members arriving, a leader being
        elected, the meta layer busy with every node at once), and members
        announce themselves only on the system account, so there is no event
        to wait on. Past the window the failure stands; with
        ``answered_refusals_stand`` so does a refusal the broker did answer,
        except its answer that JetStream is temporarily unavailable (a
        starting cluster's meta layer busy with thousands of mailboxes).
        Every ``PROVISION_PROGRESS_EVERY_S`` logs ``waiting`` with ``about``.
        """
        loop = asyncio.get_running_loop()
        next_progress = loop.time() + PROVISION_PROGRESS_EVERY_S
        while True:
            try:
                return await ask()
            except Unavailable as e:
                now = loop.time()
                refused = answered_refusals_stand and isinstance(e, _ApiError) and not e.busy
                if now >= self._settle_until or self._closed or refused:
                    raise
                if now >= next_progress:
                    next_progress = now + PROVISION_PROGRESS_EVERY_S
                    logger.info(waiting, extra={**about, "waited_s": round(now - since, 1), "reason": str(e)})
            await asyncio.sleep(PROVISION_ASK_EVERY_S)

    async def _ensure_stream(self, spec: topics.StreamSpec, *, force: bool = False) -> None:
        """Create the stream, or align an existing one with the topology; then remember it.

        Looks first: the broker's ``did_create`` is true for an idempotent create
        as well, so it cannot say whether this call created the stream.
        """
        if not force and spec.name in self._ready_streams:
            return
        async with self._provision_lock:
            if not force and spec.name in self._ready_streams:
                return
            cfg = self.stream_config(spec)
            try:
                info = await self._api(f"STREAM.INFO.{spec.name}", None, what=f"stream info {spec.name}")
            except _ApiError as e:
                if e.err_code != ERR_STREAM_NOT_FOUND:
                    raise
                await self._create_stream(spec, cfg)
            else:
                current = info.get("config") or {}
                cfg = self._keep_replicas(spec, cfg, current)
                drift = {k: (current.get(k), v) for k, v in cfg.items() if k in _ALIGNED_KEYS and current.get(k) != v}
                if drift and await self._update_stream(spec, cfg, drift) and "num_replicas" in drift:
                    logger.info(
                        "jetstream_stream_replicas_raised",
                        extra={"stream": spec.name, "replicas_was": current.get("num_replicas"), "replicas": cfg["num_replicas"]},
                    )
            self._ready_streams.add(spec.name)

    def _keep_replicas(self, spec: topics.StreamSpec, cfg: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        """``cfg`` never asking an existing stream for fewer copies than it keeps.

        Fewer replicas would drop copies somebody made on purpose (a stream
        raised by another node's setting, or by an operator), and a node
        with a smaller ``stream.replicas`` must not undo them; more are
        raised to (and logged by the caller).
        """
        have = int(current.get("num_replicas") or 1)
        if have <= cfg["num_replicas"]:
            return cfg
        logger.info(
            "jetstream_stream_replicas_kept",
            extra={"stream": spec.name, "replicas": have, "setting": cfg["num_replicas"]},
        )
        return {**cfg, "num_replicas": have}

    async def _create_stream(self, spec: topics.StreamSpec, cfg: dict[str, Any]) -> None:
        try:
            await self._api(f"STREAM.CREATE.{spec.name}", cfg, what=f"create stream {spec.name}")
        except _ApiError as e:
            if e.err_code == ERR_STREAM_NAME_IN_USE:  # another client created it meanwhile, differently
                await self._ensure_existing(spec, cfg)
                return
            if e.err_code in (ERR_NO_SUITABLE_PEERS, ERR_REPLICAS_NOT_SUPPORTED) and cfg["num_replicas"] > 1:
                raise ReplicasUnplaceable(
                    f"stream.replicas={cfg['num_replicas']}: the broker cannot place stream {spec.name} on "
                    f"{cfg['num_replicas']} servers ({e.description}); allowed: at most the cluster's members that are up"
                ) from e
            logger.error(
                "jetstream_stream_provision_failed",
                extra={"stream": spec.name, "subjects": spec.subjects, "error": e.description},
            )
            raise Unavailable(f"cannot provision stream {spec.name}: {e.description}") from e
        logger.info(
            "jetstream_stream_created",
            extra={
                "stream": spec.name,
                "subjects": spec.subjects,
                "retention": cfg["retention"],
                "storage": cfg["storage"],
                "max_age_s": cfg["max_age"] / _NS,
            },
        )

    async def _ensure_existing(self, spec: topics.StreamSpec, cfg: dict[str, Any]) -> None:
        """A stream another client created meanwhile: update it, keeping the replicas it has if more."""
        try:
            info = await self._api(f"STREAM.INFO.{spec.name}", None, what=f"stream info {spec.name}")
        except _ApiError:
            info = {}
        await self._update_stream(spec, self._keep_replicas(spec, cfg, info.get("config") or {}), {})

    async def _update_stream(self, spec: topics.StreamSpec, cfg: dict[str, Any], drift: dict[str, Any]) -> bool:
        """Update the stream to ``cfg``; False (logged) when the broker keeps it as it was."""
        try:
            await self._api(f"STREAM.UPDATE.{spec.name}", cfg, what=f"update stream {spec.name}")
        except _ApiError as e:
            # e.g. storage or retention cannot change in place: keep the stream as it is.
            logger.warning(
                "jetstream_stream_config_kept",
                extra={"stream": spec.name, "error": e.description, "drift": repr(drift)},
            )
            return False
        logger.info("jetstream_stream_updated", extra={"stream": spec.name, "drift": repr(drift)})
        return True

    def _stream_of(self, subject: str) -> topics.StreamSpec:
        spec = self._subject_streams.get(subject)
        if spec is None:
            spec = topics.stream_for(subject)
            if len(self._subject_streams) > 50_000:
                self._subject_streams.clear()
            self._subject_streams[subject] = spec
        return spec

    # -- publishing ----------------------------------------------------------------

    async def publish(self, subject: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> int:
        if len(data) > MAX_PAYLOAD_BYTES:
            raise TooLarge(f"{len(data)} bytes is over the limit of {MAX_PAYLOAD_BYTES}")
        if self._unsub_pending:
            # A puller just gave up a pull request: let its UNSUB reach the wire
            # first, so this message cannot be delivered into that request.
            await asyncio.sleep(0)
        spec = self._stream_of(subject)
        if spec.name not in self._ready_streams:
            await self._ensure_stream(spec)
        hdrs = dict(headers) if headers else {}
        # One id for every send of this publish: a send whose answer was lost
        # may have been stored, and the stream's duplicate window drops the
        # resend then, so the event is stored once either way.
        hdrs.setdefault(H_MSG_ID, secrets.token_hex(12))
        provisioned = False
        resend_until: Optional[float] = None
        while True:
            self._require_connected()
            disconnects = self._disconnects
            try:
                msg = await keeping_cancel(self._nc.request(subject, data, timeout=self._api_timeout_s, headers=hdrs))
            except nats.errors.MaxPayloadError as e:
                raise TooLarge(f"{len(data)} bytes is over the broker's max_payload {self._nc.max_payload}") from e
            except nats.errors.NoRespondersError as e:
                # No stream listens there (deleted, or a new broker): provision it once and retry.
                self._ready_streams.discard(spec.name)
                if provisioned:
                    raise Unavailable(f"no stream stores {subject!r}") from e
                provisioned = True
                await self._ensure_stream(spec)
                continue
            except nats.errors.BadSubjectError as e:
                raise InvalidArgument(f"subject={subject!r}: {e!r}") from e
            except _NATS_ERRORS as e:
                if resend_until is None:
                    resend_until = asyncio.get_running_loop().time() + self._api_timeout_s
                await self._resend_after_lost_answer(subject, hdrs[H_MSG_ID], disconnects, resend_until, e)
                continue
            body = msg.data
            if b'"error"' in body:
                try:
                    err = json.loads(body).get("error") or {}
                except ValueError:
                    err = {}
                desc = str(err.get("description", ""))
                if err.get("err_code") == ERR_MESSAGE_TOO_LARGE or "message size" in desc.lower():
                    raise TooLarge(f"publish to {subject!r}: {desc}")
                raise Unavailable(f"publish to {subject!r}: {desc or body[:200]!r}")
            return _acked_seq(body)

    async def _resend_after_lost_answer(
        self, subject: str, msg_id: str, disconnects: int, resend_until: float, error: BaseException
    ) -> None:
        """Return when a publish whose answer was lost should be sent again; raise ``Unconfirmed`` when not.

        Only an answer lost with its connection is sent for again, once the
        connection is back, and within one API timeout of the first loss: a
        broker that is up and silent (frozen, overloaded) is not asked twice
        as long, and the caller hears ``Unconfirmed`` instead.
        """
        wait_s = resend_until - asyncio.get_running_loop().time()
        if self._disconnects != disconnects and not self._closed and await self._wait_connected(wait_s):
            logger.info("jetstream_publish_resent", extra={"subject": subject, "msg_id": msg_id, "error": type(error).__name__})
            return
        raise Unconfirmed(f"publish to {subject!r} sent and not acknowledged: {error!r}") from error
