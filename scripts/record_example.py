#!/usr/bin/env python3
"""Re-create ``captures/example.jsonl``: a small real capture used as an example and
as a test fixture.

It starts a real Tansu broker, the real kinspect proxy in front of it (in this
process) with a :class:`~kinspect.capture.CaptureWriter`, and drives a real
kafka-python client through the proxy:

1. create topic ``example`` (then once more, to record TOPIC_ALREADY_EXISTS, error 36);
2. produce 3 keyed records with a header, gzip-compressed, and 2 uncompressed records;
3. consume all 5 back in consumer group ``example-group`` and commit.

Usage: ``python scripts/record_example.py [OUT]`` (default ``captures/example.jsonl``).
Timestamps, ports and producer ids differ on every run; the shape does not.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from kinspect.brokers import TansuBroker
from kinspect.capture import CaptureWriter
from kinspect.codec import Codec
from kinspect.proxy.server import Proxy, ProxyConfig

TOPIC = "example"
GROUP = "example-group"
CLIENT_ID = "kinspect-example"
VALUES_GZIP = [("k1", "hello"), ("k2", "kafka"), ("k3", "records")]
VALUES_PLAIN = [(None, "plain-1"), (None, "plain-2")]


def workload(bootstrap: str) -> list[str]:
    """The kafka-python traffic recorded; returns the values consumed."""
    common = {"bootstrap_servers": bootstrap, "client_id": CLIENT_ID,
              "request_timeout_ms": 10_000}
    admin = KafkaAdminClient(**common)
    try:
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
        except TopicAlreadyExistsError:
            pass
    finally:
        admin.close()

    producer = KafkaProducer(acks="all", compression_type="gzip", linger_ms=50, **common)
    try:
        futs = [producer.send(TOPIC, key=k.encode(), value=v.encode(),
                              headers=[("source", b"record_example")])
                for k, v in VALUES_GZIP]
        for f in futs:
            f.get(timeout=10)
    finally:
        producer.close(timeout=5)
    producer = KafkaProducer(acks=1, **common)
    try:
        for _, v in VALUES_PLAIN:
            producer.send(TOPIC, value=v.encode()).get(timeout=10)
    finally:
        producer.close(timeout=5)

    consumer = KafkaConsumer(TOPIC, group_id=GROUP, auto_offset_reset="earliest",
                             session_timeout_ms=6000, heartbeat_interval_ms=500,
                             enable_auto_commit=False, fetch_max_wait_ms=200, **common)
    want = len(VALUES_GZIP) + len(VALUES_PLAIN)
    got: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(got)} of {want}")
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.value.decode() for r in recs]
        consumer.commit()
    finally:
        consumer.close()
    return got


async def record(out: Path) -> list[str]:
    codec = Codec()
    with TansuBroker() as broker:
        host, port = broker.bootstrap.rsplit(":", 1)
        config = ProxyConfig(upstream=(host, int(port)))
        proxy = Proxy(config, codec)
        await proxy.start()
        writer = CaptureWriter(out, codec, upstream=broker.bootstrap,
                               listen="%s:%d" % proxy.address)
        proxy.pipeline.add(writer)
        try:
            bootstrap = "%s:%d" % proxy.address
            return await asyncio.to_thread(workload, bootstrap)
        finally:
            await proxy.close()  # closes the writer too


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "captures" / "example.jsonl"
    got = asyncio.run(record(out))
    print(f"consumed {got}; wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
