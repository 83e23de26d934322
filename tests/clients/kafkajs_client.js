// Round trip with kafkajs: create the topic, produce the values, consume them
// back in a consumer group. Config: JSON in argv[2] (see __init__.py).
// Prints {"consumed": [...]} as the last stdout line.
"use strict";
process.env.KAFKAJS_NO_PARTITIONER_WARNING = "1";
const { Kafka, logLevel } = require("kafkajs");

const cfg = JSON.parse(process.argv[2]);

async function main() {
  const deadline = Date.now() + cfg.timeout * 1000;
  const kafka = new Kafka({
    clientId: "kinspect-kafkajs",
    brokers: [cfg.bootstrap],
    logLevel: logLevel.WARN,
    retry: { retries: 3 },
  });

  const admin = kafka.admin();
  await admin.connect();
  // Resolves false (no error) when the topic already exists.
  await admin.createTopics({
    topics: [{ topic: cfg.topic, numPartitions: 1, replicationFactor: 1 }],
  });
  await admin.disconnect();

  const producer = kafka.producer({
    idempotent: Boolean(cfg.idempotent),
    allowAutoTopicCreation: false,
  });
  await producer.connect();
  await producer.send({
    topic: cfg.topic,
    acks: -1,
    messages: cfg.values.map((value) => ({ value })),
  });
  await producer.disconnect();

  const consumer = kafka.consumer({
    groupId: cfg.group,
    sessionTimeout: cfg.session_timeout_ms,
    heartbeatInterval: cfg.heartbeat_interval_ms,
  });
  await consumer.connect();
  await consumer.subscribe({ topic: cfg.topic, fromBeginning: true });
  const consumed = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`consumed ${consumed.length} of ${cfg.values.length} before the deadline`)),
      Math.max(0, deadline - Date.now()),
    );
    consumer
      .run({
        eachMessage: async ({ message }) => {
          consumed.push(message.value.toString());
          if (consumed.length >= cfg.values.length) {
            clearTimeout(timer);
            resolve();
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect(); // commits the consumed offsets
  console.log(JSON.stringify({ consumed }));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
