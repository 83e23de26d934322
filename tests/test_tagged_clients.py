"""Do real clients survive unknown tagged fields in responses (KIP-482)?

Each real client (tests/clients drivers: create a topic, produce, consume in a
group) runs through the real proxy in front of a real Tansu broker, with rules
that inject unknown tagged fields into every response header, at every response's
top level, in nested structs, or that strip the known tagged fields Tansu sends.

Findings (asserted per client; they fail the day a client changes):

* kafka-python 3 and confluent-kafka (librdkafka 2.x) survive every injection,
  including tag 2^31-1 with 1 MiB of data at the top level and two tags in one
  section, and the stripping of known tagged fields.
* aiokafka 0.14's producer and consumer never see a tag section: they implement
  only non-flexible versions (ApiVersions v0, Metadata v5, Fetch v11...), so every
  rule on that traffic is counted as non-flexible. Its only flexible requests are
  admin ones (ListPartitionReassignments v0, AlterPartitionReassignments v0,
  DeleteRecords v2); through ListPartitionReassignments against Tansu it reads
  unknown tags at the header, the top level and two nested levels, and keeps
  them in its ``tags`` dicts.
* kcat (Debian's, librdkafka 2.0.2) cannot read Tansu's ApiVersions v3 answer
  (tests/test_peers.py). Stripping the tagged fields of that answer fixes it, and
  two unknown tagged fields in an answer that had none break it again: its
  tag-skipping bug, not Tansu's bytes, is the cause.
"""

from __future__ import annotations

import pytest
from clients import ClientFailed, roundtrip_async
from proxyutil import Recorder

from kinspect.codec import Codec
from kinspect.flows import MUTATED, UNDECODED, UNPAIRED
from kinspect.proxy.rules import RuleSet, parse_flag
from kinspect.proxy.server import Proxy, ProxyConfig, parse_hostport

SCENARIOS = {
    "header": [
        "inject *:response:header:tag=10000:size=16",
        "inject *:response:header:tag=2147483647:size=1KiB",
    ],
    "top": [
        "inject *:response:top:tag=10000:size=8",
        "inject *:response:top:tag=2147483647:size=1MiB",
    ],
    "nested": [
        "inject Metadata:response:Topics[]:tag=10000:string=hello",
        "inject Metadata:response:Topics[].Partitions[]:tag=10001:int32=7",
        "inject Fetch:response:Responses[].Partitions[]:tag=10000:size=1KiB",
        "inject Produce:response:Responses[].PartitionResponses[]:tag=10000:size=8",
        "inject ApiVersions:response:ApiKeys[]:tag=10000:hex=00",
    ],
    "strip-known": [
        "strip *:response:top:all",
        "strip Fetch:response:Responses[].Partitions[]:all",
        "strip Produce:response:Responses[].PartitionResponses[]:all",
    ],
}

#: rules (by position in the scenario) that must have changed frames for the client,
#: so that "it survived" means it really met the tags
EXERCISED = {
    "kafka-python": {"header": [0, 1], "top": [0, 1], "nested": [0, 1, 2, 3, 4],
                     "strip-known": [0]},
    "confluent-kafka": {"header": [0, 1], "top": [0, 1], "nested": [0, 1, 2, 3, 4],
                        "strip-known": [0]},
}


def ruleset(codec: Codec, flags: list[str]) -> RuleSet:
    out = []
    for i, f in enumerate(flags):
        action, _, text = f.partition(" ")
        out.append(parse_flag(action, text, f"#{i}"))
    return RuleSet(out, codec)


async def run_through_proxy(client: str, broker, flags: list[str], topic: str, **kw):
    """Run ``client``'s round trip through a proxy applying ``flags``; return
    ``(consumed or ClientFailed, values, rules, flows)``."""
    codec = Codec()
    proxy = Proxy(ProxyConfig(upstream=parse_hostport(broker.bootstrap)), codec=codec)
    recorder = Recorder()
    proxy.pipeline.add(recorder)
    rules = ruleset(codec, flags)
    rules.install(proxy)
    await proxy.start()
    values = [f"{client} tagged {i}" for i in range(5)]
    try:
        try:
            result = await roundtrip_async(client, "{}:{}".format(*proxy.address), values, topic=topic,
                                           group=f"{topic}-g", timeout=40, **kw)
        except ClientFailed as e:
            result = e
    finally:
        await proxy.close()
    return result, values, rules, recorder.flows


def check_flows(flows, rules: RuleSet):
    assert flows
    assert not [f for f in flows if UNPAIRED in f.flags or UNDECODED in f.flags]
    mutated = [f for f in flows if MUTATED in f.flags]
    for f in mutated:
        assert f.response_sent is not None and f.response_sent != f.response
        # correlation is kept: the mutated frame answers the same request
        assert f.response_sent[:4] == f.response[:4]
    return mutated


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
async def test_client_survives_tagged_fields(client, scenario, tansu):
    result, values, rules, flows = await run_through_proxy(
        client, tansu, SCENARIOS[scenario], topic=f"tags-{scenario}")
    assert not isinstance(result, ClientFailed), str(result)
    assert result == values
    mutated = check_flows(flows, rules)
    assert mutated
    for i in EXERCISED[client][scenario]:
        assert rules.rules[i].stats.applied > 0, rules.stats()[i]
    assert all(r.stats.errors == 0 for r in rules.rules)


async def test_injected_tags_reach_the_client(tansu):
    """The bytes the client got carry the injected tags where the rules put them."""
    flags = SCENARIOS["nested"] + SCENARIOS["header"][:1]
    result, values, _, flows = await run_through_proxy(
        "kafka-python", tansu, flags, topic="tags-bytes")
    assert result == values
    codec = Codec()
    metadata = [f for f in flows if f.api_name == "Metadata" and MUTATED in f.flags
                and f.response_decoded.body.Topics]
    assert metadata
    sent = codec.decode_response(metadata[0].response_sent, 3, metadata[0].api_version)
    assert sent.header.unknown_tags == {10000: b"kinspect" * 2}
    for topic in sent.body.Topics:
        assert topic.unknown_tags == {10000: b"\x06hello"}
        for p in topic.Partitions:
            assert p.unknown_tags == {10001: b"\x00\x00\x00\x07"}
    # apart from the tags (and the broker addresses the proxy rewrites), the answer is
    # the broker's
    original = metadata[0].response_decoded
    for topic in sent.body.Topics:
        topic.unknown_tags = None
        for p in topic.Partitions:
            p.unknown_tags = None
    assert sent.body.Topics == original.body.Topics
    assert sent.body.ClusterId == original.body.ClusterId


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_aiokafka_never_sees_a_tag_section(scenario, tansu):
    result, values, rules, flows = await run_through_proxy(
        "aiokafka", tansu, SCENARIOS[scenario], topic=f"tags-{scenario}")
    assert result == values
    assert not check_flows(flows, rules)
    for r in rules.rules:
        if r.stats.matched:
            assert r.stats.non_flexible == r.stats.matched and r.stats.applied == 0
    assert rules.rules[0].stats.matched > 0
    flexible = [f for f in flows if f.api_key >= 0 and Codec().registry.request(f.api_key)
                .is_flexible(f.api_version)]
    assert flexible == []


async def test_kcat_works_on_tansu_once_api_versions_tags_are_stripped(tansu):
    result, values, rules, _ = await run_through_proxy(
        "kcat", tansu, ["strip ApiVersions:response:top:all"], topic="tags-kcat")
    assert not isinstance(result, ClientFailed), str(result)
    # the topic kcat makes Tansu auto-create can have several partitions: order may vary
    assert sorted(result) == sorted(values)
    assert rules.rules[0].stats.applied > 0


async def test_kcat_fails_on_two_unknown_tags(tansu):
    flags = ["strip ApiVersions:response:top:all",
             "inject ApiVersions:response:top:tag=10000:size=8",
             "inject ApiVersions:response:top:tag=10001:size=8"]
    result, _, rules, _ = await run_through_proxy("kcat", tansu, flags, topic="tags-kcat2")
    assert isinstance(result, ClientFailed)
    assert "ApiVersionRequest failed: Local: Read underflow" in result.output
    assert all(r.stats.applied > 0 for r in rules.rules)


async def test_aiokafka_reads_unknown_tags_in_its_flexible_admin_api(tansu):
    """aiokafka's one flexible api that Tansu answers, with unknown tags injected at
    the response header, the top level, Topics[] and Topics[].Partitions[]."""
    from aiokafka import AIOKafkaClient
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.protocol.admin import ListPartitionReassignmentsRequest

    flags = ["inject ListPartitionReassignments:response:header:tag=10000:hex=0102",
             "inject ListPartitionReassignments:response:top:tag=2147483647:size=1KiB",
             "inject ListPartitionReassignments:response:Topics[]:tag=50:string=x",
             "inject ListPartitionReassignments:response:Topics[].Partitions[]:tag=7:int32=7"]
    codec = Codec()
    proxy = Proxy(ProxyConfig(upstream=parse_hostport(tansu.bootstrap)), codec=codec)
    recorder = Recorder()
    proxy.pipeline.add(recorder)
    rules = ruleset(codec, flags)
    rules.install(proxy)
    await proxy.start()
    bootstrap = "{}:{}".format(*proxy.address)
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("reassign", 1, 1)])
        finally:
            await admin.close()
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            node = next(iter(client.cluster.brokers())).nodeId
            resp = await client.send(node, ListPartitionReassignmentsRequest(
                timeout_ms=5000, topics=[("reassign", [0], {})], tags={}))
        finally:
            await client.close()
        await proxy.pipeline.drained()
    finally:
        await proxy.close()
    assert resp.error_code == 0
    # aiokafka skipped nothing it should not have: every level parsed, tags kept
    assert set(resp.tags) == {2147483647} and len(resp.tags[2147483647]) == 1024
    [(name, partitions, topic_tags)] = resp.topics
    assert name == "reassign" and topic_tags == {50: b"\x02x"}
    [(index, replicas, adding, removing, part_tags)] = partitions
    assert index == 0 and part_tags == {7: b"\x00\x00\x00\x07"}
    assert all(r.stats.applied == 1 for r in rules.rules), rules.stats()
    mutated = [f for f in recorder.flows if MUTATED in f.flags]
    assert [f.api_name for f in mutated] == ["ListPartitionReassignments"]
