"""Round trip with kafka-python: create the topic, produce, consume in a group.

Config: JSON in argv[1] (see __init__.py). Prints {"consumed": [...]} last.
"""

import json
import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError


def main(cfg: dict) -> list[str]:
    deadline = time.monotonic() + cfg["timeout"]
    common = {"bootstrap_servers": cfg["bootstrap"], "client_id": "kinspect-kafka-python"}
    admin = KafkaAdminClient(**common)
    try:
        admin.create_topics([NewTopic(cfg["topic"], 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()

    extra = {} if cfg.get("idempotent") is None else {"enable_idempotence": cfg["idempotent"]}
    producer = KafkaProducer(acks="all", **common, **extra)
    try:
        for value in cfg["values"]:
            producer.send(cfg["topic"], value.encode()).get(timeout=10)
    finally:
        producer.close(timeout=5)

    consumer = KafkaConsumer(
        cfg["topic"],
        group_id=cfg["group"],
        auto_offset_reset="earliest",
        session_timeout_ms=cfg["session_timeout_ms"],
        heartbeat_interval_ms=cfg["heartbeat_interval_ms"],
        **common,
    )
    consumed: list[str] = []
    try:
        while len(consumed) < len(cfg["values"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(consumed)} of {len(cfg['values'])}")
            for records in consumer.poll(timeout_ms=200).values():
                consumed += [r.value.decode() for r in records]
        # "stay_s": go on polling that long (a member of the group meanwhile) first
        stay_until = time.monotonic() + cfg.get("stay_s", 0)
        while time.monotonic() < stay_until:
            consumer.poll(timeout_ms=50)
        consumer.commit()
    finally:
        consumer.close()
    return consumed


if __name__ == "__main__":
    print(json.dumps({"consumed": main(json.loads(sys.argv[1]))}))
