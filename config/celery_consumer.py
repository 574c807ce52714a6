"""The Celery workers' consumer: Celery's, made to survive losing Redis and to reconnect within seconds.

Found from outside and reproduced with a bare Celery app (celery 5.7, kombu 5.7, redis-py 8.1): a
worker that holds an unacknowledged message when Redis goes away (an ETA task, as the forecast
refresh's countdown makes, or an acks_late task running in a prefork child) exits with
`CRITICAL Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`.
The `forecasts` worker nearly always holds a refresh queued with a countdown, so it died in 11 of 12
outages; the rounds' worker rarely holds one, so it almost always lived.

Why: on a lost connection Celery's `Consumer.on_connection_error_after_connected` first calls
`connection.collect()`, which closes the default channel (the task consumer's) and then detaches the
transport (`transport.client = None`), then calls `connection.close()`, which closes that channel again.
With Redis the first close gives up at once: it reads the reply of the BRPOP in flight from the dead
socket, a connection error that kombu ignores, and the channel is left open. The second close requeues
the unacked messages, which builds a new Redis pool from `transport.client`, None by then: an
AttributeError, which is not a connection error, so nothing catches it and the worker stops.

Here the channel is closed while its transport is still attached, before Celery's two closes: a first
attempt clears the BRPOP in flight (as above), a second requeues the unacked messages and marks the
channel closed, so that Celery's closes find nothing left to do. With Redis down the requeue fails with a
connection error (logged): the messages stay in Redis's unacked set, which kombu restores after the
visibility timeout, as it does for a worker that died; a Redis restarted empty has lost them anyway.

Reconnecting: Celery retries a lost broker after 2, 4, 6 ... s, up to 30 s apart (kombu's defaults, which
no Celery setting changes), so after a few short outages in a row (the fault test's loop) a worker was
still waiting out a long retry when Redis had long been back: no round for 30 s. Here the retries come
1, 2, 3 ... s apart, at most RECONNECT_MAX_S: a refused connection costs next to nothing.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

logger = logging.getLogger(__name__)

# The first close gives up on the BRPOP in flight, the second one closes: more would be a new failure.
CLOSE_ATTEMPTS = 3
RECONNECT_FIRST_S = 1.0  # the broker's retries: this long after the loss, then 1 s longer each time,
RECONNECT_MAX_S = 5.0  # up to this


class Consumer(CeleryConsumer):
    """`worker_consumer` (config/celery.py): Celery's consumer, closing a lost connection's channel safely."""

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        channel_close_while_attached(self.connection)
        super().on_connection_error_after_connected(exc)

    def ensure_connected(self, conn: Any) -> Any:
        # Celery calls conn.ensure_connection(errback, max_retries, callback=...) without intervals.
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RECONNECT_FIRST_S,
            interval_step=RECONNECT_FIRST_S,
            interval_max=RECONNECT_MAX_S,
        )
        return super().ensure_connected(conn)


def channel_close_while_attached(connection: Any) -> bool:
    """Close `connection`'s default channel, if it has one, while its transport is attached; returns
    whether it is closed (or there was none). Never raises: the caller is handling a lost broker."""
    # The attribute, not the `default_channel` property, which would open a channel on the dead broker.
    channel = getattr(connection, "_default_channel", None)
    if channel is None:
        return True
    for attempt in range(1, CLOSE_ATTEMPTS + 1):
        if getattr(channel, "closed", True):
            return True
        try:
            channel.close()
        except Exception as exc:  # the broker is away: expected, and what Celery's closes would ignore
            logger.info("closing the lost broker connection's channel (attempt %d): %r", attempt, exc)
    closed = bool(getattr(channel, "closed", True))
    if not closed:
        logger.warning("the lost broker connection's channel is still open after %d attempts", CLOSE_ATTEMPTS)
    return closed
