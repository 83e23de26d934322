"""Record a real capture to analyse: a real kafka-python client, through the real
proxy, against a real broker (for the analysis tests and ``bench/analyze.py``).

The proxy runs in-process on its own event-loop thread with a
:class:`~kinspect.capture.CaptureWriter`; the client produces with several
compression codecs and consumes in a consumer group.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: consumer-group timeouts Tansu needs to join quickly (see GUIDE.md)
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500


@dataclass
class SampleResult:
    """What the workload did: messages produced per codec, consumed, frames captured."""

    path: Path
    produced: dict[str, int] = field(default_factory=dict)
    consumed: int = 0
    frames: int = 0
    topic: str = ""


class ProxyThread:
    """A :class:`~kinspect.proxy.server.Proxy` with a capture writer, running on an
    event loop in a background thread. Use as a context manager; ``bootstrap`` is
    the ``host:port`` clients connect to."""

    def __init__(self, upstream: str, capture: Path):
        self.upstream = upstream
        self.capture = capture
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kinspect-proxy",
                                       daemon=True)
        self.proxy = None
        self.writer = None

    def __enter__(self) -> ProxyThread:
        from ..capture import CaptureWriter
        from ..codec import Codec
        from ..proxy.server import Proxy, ProxyConfig

        host, port = self.upstream.rsplit(":", 1)
        codec = Codec()
        self.proxy = Proxy(ProxyConfig(upstream=(host, int(port))), codec)
        self.writer = CaptureWriter(self.capture, codec, upstream=self.upstream)
        self.proxy.pipeline.add(self.writer)
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        except BaseException:
            self._stop_loop()
            raise
        return self

    @property
    def bootstrap(self) -> str:
        host, port = self.proxy.address
        return f"{host}:{port}"

    def __exit__(self, *exc) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def run_workload(bootstrap: str, topic: str, *, messages: int = 30,
                 codecs: tuple[str, ...] = ("gzip", "zstd", None), partitions: int = 2,
                 group: str | None = None, timeout: float = 60.0) -> tuple[dict[str, int], int]:
    """Create ``topic``, produce ``messages`` per compression codec (``None`` =
    uncompressed), then consume everything in a consumer group.

    Returns ``({codec: produced}, consumed)``.

    Raises:
        TimeoutError: not everything was consumed within ``timeout`` seconds.
    """
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kinspect-analysis-admin",
                             request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)], timeout_ms=10_000)
    finally:
        admin.close()
    produced: dict[str, int] = {}
    for codec in codecs:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                 compression_type=codec, linger_ms=5, max_block_ms=10_000,
                                 client_id=f"kinspect-analysis-{codec or 'none'}",
                                 request_timeout_ms=10_000)
        try:
            futures = [producer.send(topic, key=b"k%d" % (i % 5),
                                     value=(f"message {i} compressed with {codec} " * 4).encode())
                       for i in range(messages)]
            producer.flush(timeout=timeout)
            for f in futures:
                f.get(timeout=timeout)
        finally:
            producer.close(timeout=10)
        produced[codec or "none"] = messages
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap,
                             group_id=group or f"{topic}-group", auto_offset_reset="earliest",
                             session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                             client_id="kinspect-analysis-consumer", request_timeout_ms=10_000)
    consumed = 0
    want = messages * len(codecs)
    deadline = time.monotonic() + timeout
    try:
        while consumed < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {consumed} of {want} messages in {timeout} s")
            for records in consumer.poll(timeout_ms=200).values():
                consumed += len(records)
        consumer.commit()
    finally:
        consumer.close()
    return produced, consumed


def record_sample(path: str | Path, broker_bootstrap: str | None = None, *,
                  topic: str = "kinspect-analysis", messages: int = 30) -> SampleResult:
    """Record a capture of :func:`run_workload` through the proxy to ``path``.

    Starts a :class:`~kinspect.brokers.TansuBroker` when ``broker_bootstrap`` is
    not given (stopped again before returning).
    """
    path = Path(path)
    if broker_bootstrap is None:
        from ..brokers import TansuBroker

        with TansuBroker() as broker:
            return record_sample(path, broker.bootstrap, topic=topic, messages=messages)
    result = SampleResult(path=path, topic=topic)
    with ProxyThread(broker_bootstrap, path) as pt:
        result.produced, result.consumed = run_workload(pt.bootstrap, topic, messages=messages)
    result.frames = pt.writer.frames
    return result
