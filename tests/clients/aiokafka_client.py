"""Round trip with aiokafka: create the topic, produce, consume in a group.

Config: JSON in argv[1] (see __init__.py). Prints {"consumed": [...]} last.
"""

import asyncio
import json
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

TOPIC_ALREADY_EXISTS = 36


async def roundtrip(cfg: dict) -> list[str]:
    common = {"bootstrap_servers": cfg["bootstrap"], "client_id": "kinspect-aiokafka"}
    admin = AIOKafkaAdminClient(**common)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(cfg["topic"], 1, 1)])
    finally:
        await admin.close()
    for topic, code, *_ in response.topic_errors:
        if code not in (0, TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"CreateTopics {topic}: error {code}")

    producer = AIOKafkaProducer(
        acks="all", enable_idempotence=bool(cfg.get("idempotent")), **common
    )
    await producer.start()
    try:
        for value in cfg["values"]:
            await producer.send_and_wait(cfg["topic"], value.encode())
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        cfg["topic"],
        group_id=cfg["group"],
        auto_offset_reset="earliest",
        session_timeout_ms=cfg["session_timeout_ms"],
        heartbeat_interval_ms=cfg["heartbeat_interval_ms"],
        **common,
    )
    await consumer.start()
    consumed: list[str] = []
    try:
        while len(consumed) < len(cfg["values"]):
            for records in (await consumer.getmany(timeout_ms=200)).values():
                consumed += [r.value.decode() for r in records]
        await consumer.commit()
    finally:
        await consumer.stop()
    return consumed


def main(cfg: dict) -> list[str]:
    return asyncio.run(asyncio.wait_for(roundtrip(cfg), cfg["timeout"]))


if __name__ == "__main__":
    print(json.dumps({"consumed": main(json.loads(sys.argv[1]))}))
