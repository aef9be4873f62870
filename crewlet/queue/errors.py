"""The queue's one error tree.

Backends translate their third-party exceptions at the boundary
(``raise Unavailable(...) from e``) so that nothing above ``crewlet.queue``
ever sees a ``nats`` type.
"""
from __future__ import annotations


class QueueError(Exception):
    """Base of every error the queue raises."""


class TooLarge(QueueError):
    """The encoded event is over MAX_PAYLOAD_BYTES. Permanent: retrying cannot help."""


class NotLive(QueueError):
    """The client was closed. Permanent: every verb of a closed client raises this."""

    def __init__(self, message: str = "queue client is not live (closed)") -> None:
        super().__init__(message)


class Unavailable(QueueError):
    """The broker cannot be reached right now. Retryable (a webhook edge answers 503)."""


class Unconfirmed(Unavailable):
    """A publish was sent but its acknowledgement never came (the connection was lost on the way back,
    or the broker did not answer in time), and sending it again under the same id did not settle it
    either: the event may be stored. Retryable like any ``Unavailable``."""


class ReplicasUnplaceable(Unavailable):
    """The broker cannot keep a stream at the replicas asked for: fewer servers up than copies (or a lone server)."""


class ConsumerLimit(QueueError):
    """The broker refuses another durable subscription: a stream's or the account's consumer limit is reached.

    Permanent until an operator raises the limit (``stream.max_consumers``), so never retried.
    """


class InvalidArgument(QueueError, ValueError):
    """The caller asked for something the contract refuses (no event, bad pattern, ...)."""


class Gone(QueueError):
    """What a verb named no longer exists: an attachment's durable subscription (deleted),
    or a dead letter that is not, or no longer, on CREWLET_DLQ (replayed, or aged out)."""


class NoAnswer(QueueError):
    """Raised by a ``serve`` answer function that gives no answer on purpose (the request is not its to answer).

    The asker sees a missing answer, as for any answer that raises, but the
    server logs it at debug level only: it is the server's decision, not a fault.
    """
