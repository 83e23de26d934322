"""Round trip with confluent-kafka (librdkafka): create the topic, produce, consume in a group.

Config: JSON in argv[1] (see __init__.py). Prints {"consumed": [...]} last.
"""

import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def main(cfg: dict) -> list[str]:
    deadline = time.monotonic() + cfg["timeout"]
    common = {"bootstrap.servers": cfg["bootstrap"], "client.id": "kinspect-confluent"}
    admin = AdminClient(common)  # must outlive the future
    future = admin.create_topics([NewTopic(cfg["topic"], 1, 1)])[cfg["topic"]]
    try:
        future.result(timeout=10)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise

    producer = Producer(
        {**common, "acks": "all", "enable.idempotence": bool(cfg.get("idempotent"))}
    )
    failures = []
    for value in cfg["values"]:
        producer.produce(
            cfg["topic"], value.encode(), on_delivery=lambda err, _: err and failures.append(err)
        )
    if producer.flush(10) or failures:
        raise RuntimeError(f"delivery failed: {failures or 'flush timed out'}")

    consumer = Consumer(
        {
            **common,
            "group.id": cfg["group"],
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": cfg["session_timeout_ms"],
            "heartbeat.interval.ms": cfg["heartbeat_interval_ms"],
        }
    )
    consumed: list[str] = []
    try:
        consumer.subscribe([cfg["topic"]])
        while len(consumed) < len(cfg["values"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(consumed)} of {len(cfg['values'])}")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            consumed.append(msg.value().decode())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return consumed


if __name__ == "__main__":
    print(json.dumps({"consumed": main(json.loads(sys.argv[1]))}))
