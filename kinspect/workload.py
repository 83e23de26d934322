"""A small real client workload (kafka-python) that gives ``kinspect demo`` traffic to show.

Each round produces a batch of messages to one topic and consumes them back in a
consumer group. Everything is bounded by timeouts; group timeouts are short
because Tansu takes about half the session timeout to complete a group join.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

__all__ = ["WorkloadError", "WorkloadResult", "run_forever", "run_workload"]

CLIENT_ID = "kinspect-demo"
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500
ROUND_TIMEOUT = 30.0


class WorkloadError(RuntimeError):
    """The workload could not produce or consume its messages in time."""


@dataclass
class WorkloadResult:
    """Messages produced and consumed, and rounds completed (a stop can cut the last one short)."""

    produced: int = 0
    consumed: int = 0
    rounds: int = 0


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` if it does not exist yet."""
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, client_id=CLIENT_ID, request_timeout_ms=10_000
    )
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)], timeout_ms=10_000)
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


class _Session:
    """One producer and one group consumer on a topic, reused across rounds."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        common = {
            "bootstrap_servers": bootstrap,
            "client_id": CLIENT_ID,
            "request_timeout_ms": 10_000,
        }
        self.topic = topic
        self.producer = KafkaProducer(acks="all", max_block_ms=10_000, **common)
        try:
            self.consumer = KafkaConsumer(
                topic,
                group_id=group,
                auto_offset_reset="earliest",
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                **common,
            )
        except BaseException:
            self.producer.close(timeout=5)
            raise
        self.serial = 0

    def round(self, messages: int, result: WorkloadResult, stop_event: threading.Event | None):
        """Produce ``messages`` messages, then consume as many (or until stopped)."""
        deadline = time.monotonic() + ROUND_TIMEOUT
        futures = []
        for _ in range(messages):
            value = f"kinspect message {self.serial}".encode()
            futures.append(self.producer.send(self.topic, value, key=b"%d" % self.serial))
            self.serial += 1
        self.producer.flush(timeout=ROUND_TIMEOUT)
        for future in futures:
            future.get(timeout=max(0.1, deadline - time.monotonic()))
            result.produced += 1
        wanted = messages
        while wanted > 0 and not (stop_event and stop_event.is_set()):
            if time.monotonic() > deadline:
                raise WorkloadError(
                    f"consumed {messages - wanted} of {messages} within {ROUND_TIMEOUT} s"
                )
            for records in self.consumer.poll(timeout_ms=200).values():
                wanted -= len(records)
                result.consumed += len(records)
        self.consumer.commit()
        if wanted <= 0:
            result.rounds += 1

    def close(self) -> None:
        self.consumer.close()
        self.producer.close(timeout=5)


def run_workload(
    bootstrap: str,
    topic: str = "kinspect-demo",
    messages: int = 20,
    group: str = "kinspect-demo-group",
    stop_event: threading.Event | None = None,
) -> WorkloadResult:
    """Create ``topic``, produce ``messages`` messages and consume them in ``group``.

    Returns the counts; raises :class:`WorkloadError` (or a kafka-python error)
    if that does not finish within the round timeout. Setting ``stop_event``
    ends consumption early.
    """
    ensure_topic(bootstrap, topic)
    result = WorkloadResult()
    session = _Session(bootstrap, topic, group)
    try:
        session.round(messages, result, stop_event)
    finally:
        session.close()
    return result


def run_forever(
    bootstrap: str,
    stop_event: threading.Event,
    interval: float = 1.0,
    topic: str = "kinspect-demo",
    messages: int = 10,
    group: str = "kinspect-demo-group",
    rounds: int | None = None,
) -> WorkloadResult:
    """Repeat produce/consume rounds every ``interval`` s until ``stop_event`` is set,
    or ``rounds`` rounds are done (``None``: no limit), on one producer and one group
    consumer (the group is joined once).

    Returns the totals. Each round is bounded like :func:`run_workload`; setting
    ``stop_event`` also ends the pause between rounds.
    """
    ensure_topic(bootstrap, topic)
    result = WorkloadResult()
    session = _Session(bootstrap, topic, group)
    try:
        n = 0
        while not stop_event.is_set() and (rounds is None or n < rounds):
            if n and stop_event.wait(interval):
                break
            session.round(messages, result, stop_event)
            n += 1
    finally:
        session.close()
    return result
