"""The main job end to end: real clients → the real proxy → real brokers.

Every frame that crosses the proxy must decode and re-encode to the identical
bytes, pairing must hold, and the client must receive exactly what the broker
sent except for rewritten broker addresses.
"""

from __future__ import annotations

import json
import os

import pytest
from clients import roundtrip_async
from proxyutil import (
    bootstrap_of,
    codec,
    exchange,
    exchange_sync,
    request_bytes,
    running_proxy,
)

from kinspect.brokers import TansuBroker
from kinspect.codec import Codec, DecodeError
from kinspect.codec.values import struct_class
from kinspect.flows import CLOSED, NO_RESPONSE, REWRITTEN, UNDECODED, UNPAIRED, Flow
from kinspect.proxy.rewrite import AddressRewriter

pytestmark = pytest.mark.asyncio


def _endpoints(c: Codec, flow: Flow, data: bytes) -> list[tuple[int, str, int]]:
    resp = c.decode_response(data, flow.api_key, flow.api_version)
    return AddressRewriter(c.registry).endpoints(flow.api_key, flow.api_version, resp.body)


def _strip_endpoints(c: Codec, flow: Flow, data: bytes) -> dict:
    """The decoded response with every endpoint's Host/Port blanked."""
    resp = c.decode_response(data, flow.api_key, flow.api_version)
    AddressRewriter(c.registry).rewrite(flow.api_key, flow.api_version, resp.body,
                                        lambda node, host, port: ("", 0))
    return resp.to_dict()


def assert_lossless(flows: list[Flow], proxy_addresses: set[tuple[str, int]]) -> None:
    """Every frame decodes and re-encodes to the same bytes; what the client got
    differs from what the broker sent only in rewritten addresses, which all point
    at the proxy."""
    c = codec()
    assert flows, "no flows crossed the proxy"
    for flow in flows:
        where = f"{flow!r}"
        assert not flow.flags & {UNDECODED, UNPAIRED}, f"{where}: {flow.error}"
        assert flow.error is None, f"{where}: {flow.error}"
        assert flow.request_decoded is not None and flow.request_decoded.body is not None, where
        assert c.encode_request(flow.request_decoded) == flow.request, where
        if flow.response is None:
            assert flow.flags & {NO_RESPONSE, CLOSED}, where
            continue
        assert flow.response_decoded is not None, where
        assert c.encode_response(flow.response_decoded) == flow.response, where
        if REWRITTEN in flow.flags:
            assert flow.response_sent is not None and flow.response_sent != flow.response
            assert _strip_endpoints(c, flow, flow.response_sent) == \
                _strip_endpoints(c, flow, flow.response), f"{where}: more than addresses changed"
        else:
            assert flow.response_sent is None, where
        sent = flow.response_sent or flow.response
        for node, host, port in _endpoints(c, flow, sent):
            assert (host, port) in proxy_addresses, \
                f"{where}: client told to connect to broker {node} at {host}:{port}, not the proxy"


def proxy_addresses(proxy) -> set[tuple[str, int]]:
    return {(proxy.advertised_host(), lst.port) for lst in proxy.listeners.values()}


def record_usage(name: str, flows: list[Flow]) -> set[tuple[str, int]]:
    """(api, version) pairs a client used; appended to $KINSPECT_API_USAGE if set."""
    used = {(f.api_name, f.api_version) for f in flows if f.api_key >= 0}
    path = os.environ.get("KINSPECT_API_USAGE")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"client": name, "apis": sorted(used)}) + "\n")
    return used


async def lossless_round_trip(client: str, broker, broker_name: str, n: int, unique):
    """``client`` produces and consumes ``n`` values through the proxy in front of
    ``broker``; asserts it got them back and that the session was lossless.
    Returns ``(flows, api names used)``."""
    values = [f"{client}-{broker_name}-{i}" for i in range(n)]
    async with running_proxy(broker.bootstrap) as (proxy, rec):
        got = await roundtrip_async(client, bootstrap_of(proxy), values, topic=unique("topic"),
                                    group=unique("group"))
        await proxy.pipeline.drained()
        addresses = proxy_addresses(proxy)
    assert got == values
    assert_lossless(rec.flows, addresses)
    used = record_usage(f"{client} -> {broker_name}", rec.flows)
    return rec.flows, {name for name, _ in used}


CLIENTS = ["kafka-python", "aiokafka", "confluent-kafka", "kafkajs"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_real_client_through_proxy_to_tansu(client, tansu, unique):
    flows, apis = await lossless_round_trip(client, tansu, "Tansu", 5, unique)
    assert {"ApiVersions", "Metadata", "Produce", "Fetch", "FindCoordinator", "JoinGroup",
            "SyncGroup", "OffsetCommit"} <= apis, apis
    # nothing went around the proxy: Tansu advertises its own port, which differs
    assert any(REWRITTEN in f.flags for f in flows)


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "kcat"])
async def test_clients_never_bypass_proxy_with_noida(client, noida, unique):
    """noida-db advertises its own address and cannot be told otherwise: only
    rewriting keeps the client on the proxy. Every produce and fetch must cross it."""
    flows, apis = await lossless_round_trip(client, noida, "noida-db", 4, unique)
    assert {"Produce", "Fetch"} <= apis, apis
    rewritten = [f for f in flows if REWRITTEN in f.flags]
    assert rewritten, "noida-db's own address never reached the client unrewritten"


async def test_client_receives_exactly_the_broker_bytes(tansu):
    """ApiVersions and Metadata asked directly and through the proxy: ApiVersions is
    byte-identical; Metadata differs only in the rewritten host/port."""
    host, port = tansu.bootstrap.rsplit(":", 1)
    reqs = [request_bytes(18, 3, 1, ClientSoftwareName="kinspect-test",
                          ClientSoftwareVersion="1"),
            request_bytes(3, 12, 2, Topics=None)]
    direct = exchange_sync(host, int(port), reqs)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        via = await exchange(*proxy.address, reqs)
        await proxy.pipeline.drained()
    assert via[0] == direct[0]
    c = codec()
    meta_flow = next(f for f in rec.flows if f.api_key == 3)
    assert meta_flow.response == direct[1], "the broker answered the proxy differently"
    assert via[1] == meta_flow.response_sent
    assert _strip_endpoints(c, meta_flow, via[1]) == _strip_endpoints(c, meta_flow, direct[1])
    [(node, h, p)] = _endpoints(c, meta_flow, via[1])
    assert (h, p) == proxy.address


async def test_pipelined_requests_pair_by_correlation_id(tansu):
    reqs = [request_bytes(18, 3, 100 + i, ClientSoftwareName="k", ClientSoftwareVersion="1")
            if i % 2 == 0 else request_bytes(3, 12, 100 + i, Topics=None) for i in range(8)]
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        responses = await exchange(*proxy.address, reqs)
        await proxy.pipeline.drained()
    c = codec()
    assert [c.response_correlation_id(r) for r in responses] == list(range(100, 108))
    assert sorted(f.correlation_id for f in rec.flows) == list(range(100, 108))
    for f in rec.flows:
        assert f.api_key == (18 if f.correlation_id % 2 == 0 else 3)
        assert f.response_decoded.correlation_id == f.correlation_id


async def test_acks_zero_produce_expects_no_response(tansu, unique):
    """Produce with acks=0 expects no response and the requests after it still pair.

    Finding: Tansu 0.6 answers acks=0 Produce anyway (Kafka brokers do not). The
    proxy forwards the stray response unchanged, flags it ``unpaired`` and names the
    acks=0 flow it answers, so it decodes as a Produce response."""
    topic = unique("acks0")
    c = codec()
    treq = c.request_codec(19).spec.struct.field("Topics").struct.cls
    create = request_bytes(19, 7, 1, Topics=[treq(Name=topic, NumPartitions=1,
                                                  ReplicationFactor=1)], timeoutMs=5000)
    pcls = c.request_codec(0).spec.struct.field("TopicData").struct
    part = pcls.field("PartitionData").struct.cls
    produce = request_bytes(0, 9, 2, Acks=0, TimeoutMs=1000, TransactionalId=None,
                            TopicData=[pcls.cls(Name=topic, PartitionData=[
                                part(Index=0, Records=_one_record_batch())])])
    meta = request_bytes(3, 12, 3, Topics=None)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        await exchange(*proxy.address, [create])
        responses = await _read_until(proxy.address, [produce, meta], last_correlation_id=3)
        await proxy.pipeline.drained()
    produce_flow = next(f for f in rec.flows if f.api_key == 0 and NO_RESPONSE in f.flags)
    assert produce_flow.correlation_id == 2 and produce_flow.response is None
    meta_flow = next(f for f in rec.flows if f.api_key == 3 and f.correlation_id == 3)
    assert meta_flow.response is not None and UNPAIRED not in meta_flow.flags
    assert c.response_correlation_id(responses[-1]) == 3
    stray = [f for f in rec.flows if UNPAIRED in f.flags]
    # the Tansu quirk, asserted so that this test notices when it changes
    assert [c.response_correlation_id(r) for r in responses] == [2, 3]
    assert len(stray) == 1 and stray[0].api_name == "Produce" and stray[0].correlation_id == 2
    assert stray[0].response == responses[0]
    assert stray[0].response_decoded is not None
    assert any(f"flow #{produce_flow.id}" in n for n in stray[0].notes)


async def _read_until(address, frames: list[bytes], last_correlation_id: int) -> list[bytes]:
    """Send ``frames`` pipelined; read responses until ``last_correlation_id`` arrives."""
    import asyncio
    import struct

    from kinspect.codec import frame

    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b"".join(frame(f) for f in frames))
        await writer.drain()
        out = []
        while True:
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))
            out.append(await reader.readexactly(size))
            if struct.unpack_from(">i", out[-1])[0] == last_correlation_id:
                return out
    finally:
        writer.close()


def _one_record_batch() -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    b.append(timestamp=None, key=None, value=b"acks0")
    b.close()
    return bytes(b.buffer())


async def test_port_per_broker_for_multi_broker_responses(tansu):
    """Metadata, FindCoordinator, DescribeCluster and KIP-951 NodeEndpoints responses
    naming several brokers: each distinct broker gets its own listener, which
    forwards to that broker. The responses are built with the codec (one real
    broker presents one node); the listeners are exercised over real sockets
    against two real brokers."""
    c = codec()
    host_a, port_a = tansu.bootstrap.rsplit(":", 1)
    with TansuBroker() as other:
        host_b, port_b = other.bootstrap.rsplit(":", 1)
        brokers = [(1, host_a, int(port_a)), (2, host_b, int(port_b)), (3, host_a, int(port_a))]
        async with running_proxy(tansu.bootstrap) as (proxy, rec):
            for api_key, version, body in _multi_broker_bodies(c, brokers):
                frame_ = _response_frame(c, api_key, version, body)
                new = proxy.rewrite_response(api_key, version, frame_)
                assert new is not None
                flow = Flow(0, 0, "", "", api_key, version, 7, "", b"", 0)
                got = _endpoints(c, flow, new)
                # same upstream address -> same listener; different -> different
                by_upstream = {}
                for (node, h, p), (_, uh, up) in zip(got, _endpoints(c, flow, frame_)):
                    assert h == proxy.advertised_host()
                    by_upstream.setdefault((uh, up), set()).add(p)
                assert all(len(ports) == 1 for ports in by_upstream.values()), by_upstream
                assert len({next(iter(p)) for p in by_upstream.values()}) == len(by_upstream)
                assert _strip_endpoints(c, flow, new) == _strip_endpoints(c, flow, frame_)
            # error answers carry placeholder endpoints: left alone, no listener made
            placeholder = struct_class(c.registry.response(10).struct)(
                ErrorCode=15, NodeId=-1, Host="", Port=-1)
            frame_ = _response_frame(c, 10, 2, placeholder)
            before = set(proxy.listeners)
            assert proxy.rewrite_response(10, 2, frame_) is None
            assert set(proxy.listeners) == before
            listener_a = proxy.listeners[(host_a, int(port_a))]
            listener_b = proxy.listeners[(host_b, int(port_b))]
            assert listener_a is proxy.bootstrap and listener_b.port != listener_a.port
            # each listener reaches its own broker: Metadata through B names B's address,
            # which the proxy rewrites to B's listener
            for lst in (listener_a, listener_b):
                [resp] = await exchange(proxy.advertised_host(), lst.port,
                                        [request_bytes(3, 12, 9, Topics=None)])
                flow = Flow(0, 0, "", "", 3, 12, 9, "", b"", 0)
                assert [(h, p) for _, h, p in _endpoints(c, flow, resp)] == \
                    [(proxy.advertised_host(), lst.port)]


def _response_frame(c: Codec, api_key: int, version: int, body) -> bytes:
    from kinspect.codec.protocol import Response

    hv = c.response_header_version(api_key, version)
    return c.encode_response(Response(api_key, version, 7, hv, None, body, 0, "", version))


def _multi_broker_bodies(c: Codec, brokers):
    """(api_key, version, body) for responses listing ``brokers`` [(id, host, port)]."""
    reg = c.registry

    def cls_of(api_key, *path):
        st = reg.response(api_key).struct
        for name in path:
            st = st.field(name).struct
        return struct_class(st)

    meta = cls_of(3)(Brokers=[cls_of(3, "Brokers")(NodeId=n, Host=h, Port=p)
                              for n, h, p in brokers])
    yield 3, 12, meta
    yield 3, 1, cls_of(3)(Brokers=[cls_of(3, "Brokers")(NodeId=n, Host=h, Port=p)
                                   for n, h, p in brokers])
    fc = cls_of(10)(Coordinators=[cls_of(10, "Coordinators")(Key=f"g{n}", NodeId=n, Host=h,
                                                             Port=p) for n, h, p in brokers])
    yield 10, 4, fc
    n, h, p = brokers[1]
    yield 10, 2, cls_of(10)(NodeId=n, Host=h, Port=p)
    dc = cls_of(60)(Brokers=[cls_of(60, "Brokers")(BrokerId=n, Host=h, Port=p)
                             for n, h, p in brokers])
    yield 60, 0, dc
    for api_key, version in ((0, 10), (1, 16)):
        spec = reg.response(api_key)
        ep = struct_class(spec.struct.field("NodeEndpoints").struct)
        yield api_key, version, struct_class(spec.struct)(
            NodeEndpoints=[ep(NodeId=n, Host=h, Port=p) for n, h, p in brokers])


async def test_produce_and_fetch_responses_without_node_endpoints_are_only_scanned(tansu):
    """Produce v10+ and Fetch v16+ responses are held for KIP-951 NodeEndpoints;
    one whose top-level tag section lacks the tag (the usual case, also with other,
    unknown tags) is scanned, not decoded, and forwarded unchanged; one with the tag
    is decoded and rewritten."""
    c = codec()
    reg = c.registry
    async with running_proxy(tansu.bootstrap) as (proxy, _rec):
        for api_key, version in ((0, 10), (0, 11), (1, 16), (1, 17)):
            if not reg.response(api_key).valid_versions.contains(version):
                continue
            cls = struct_class(reg.response(api_key).struct)
            plain = _response_frame(c, api_key, version, cls())
            assert proxy.rewrite_response(api_key, version, plain) is None
            other = _response_frame(c, api_key, version, cls(unknown_tags={5: b"x"}))
            assert proxy.rewrite_response(api_key, version, other) is None
            host, port = tansu.bootstrap.rsplit(":", 1)
            ep = struct_class(reg.response(api_key).struct.field("NodeEndpoints").struct)
            tagged = _response_frame(c, api_key, version, cls(
                NodeEndpoints=[ep(NodeId=1, Host=host, Port=int(port))],
                unknown_tags={5: b"x"}))
            new = proxy.rewrite_response(api_key, version, tagged)
            assert new is not None
            resp = c.decode_response(new, api_key, version)
            assert resp.body.NodeEndpoints[0].Port == proxy.address[1]
            assert resp.body.unknown_tags == {5: b"x"}
        # a malformed one still fails like a decode would
        with pytest.raises(DecodeError):
            proxy.rewrite_response(0, 10, plain[:-3] + b"\x05\x05\x05")


async def test_undecodable_frames_are_forwarded_unchanged_and_flagged(tansu):
    """An unknown api key and a malformed body reach the broker byte for byte and
    are flagged ``undecoded``; the broker's answer (or its closing the connection)
    reaches the client."""
    import asyncio
    import struct

    from kinspect.codec import frame

    good = request_bytes(3, 12, 1, Topics=None)
    malformed = good[:-1] + b"\x05\xff\xff"  # the body does not end where it should
    unknown = struct.pack(">hhi", 999, 0, 2) + b"\x00\x01t" + b"payload"
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(frame(malformed))
        await writer.drain()
        answered = await _read_or_eof(reader)
        writer.close()
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(frame(unknown))
        await writer.drain()
        answered_unknown = await _read_or_eof(reader)
        writer.close()
        await proxy.pipeline.drained()
    by_req = {f.request: f for f in rec.flows}
    assert set(by_req) == {malformed, unknown}
    bad = by_req[malformed]
    assert UNDECODED in bad.flags and "Metadata v12" in bad.error and "offset" in bad.error
    unk = by_req[unknown]
    assert UNDECODED in unk.flags and "no spec for api key 999" in unk.error
    assert unk.api_name == "ApiKey(999)"
    # what the broker did with them is its business; the proxy only relayed it
    for flow, got in ((bad, answered), (unk, answered_unknown)):
        assert got == flow.response, (flow, got)


async def _read_or_eof(reader) -> bytes | None:
    import asyncio
    import struct

    try:
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def test_a_rewrite_changes_only_the_addresses_whatever_the_broker_s_encoding(tansu):
    """A response the codec would encode otherwise than the broker did (a boolean byte
    0x05, read as true, which re-encoding writes as 0x01) gets its new addresses
    spliced into its own bytes: only they change. A real client's Metadata through
    the proxy is rewritten the same way (no note on the flow)."""
    c = codec()
    host, port = tansu.bootstrap.rsplit(":", 1)
    body = c.response_codec(3).cls.from_dict({
        "Brokers": [{"NodeId": 1, "Host": host, "Port": int(port)}],
        "Topics": [{"ErrorCode": 0, "Name": "t", "IsInternal": True, "Partitions": []}]})
    canonical = _response_frame(c, 3, 1, body)
    i = canonical.index(b"\x00\x01t") + 3  # IsInternal follows the name "t"
    assert canonical[i] == 1
    odd = canonical[:i] + b"\x05" + canonical[i + 1:]
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        new = proxy.rewrite_response(3, 1, canonical)
        resp = c.decode_response(canonical, 3, 1)
        AddressRewriter(c.registry).rewrite(3, 1, resp.body, proxy.map_address)
        assert new == c.encode_response(resp)  # the codec's own bytes: as re-encoded
        new_odd = proxy.rewrite_response(3, 1, odd)
        j = new.index(b"\x00\x01t") + 3
        assert new[j] == 1 and new_odd == new[:j] + b"\x05" + new[j + 1:]
        [(_, h, p)] = AddressRewriter(c.registry).endpoints(
            3, 1, c.decode_response(new_odd, 3, 1).body)
        assert (h, p) == (proxy.advertised_host(), proxy.address[1])
        # a malformed one still fails as a decode tells it (where and what)
        with pytest.raises(DecodeError, match="offset"):
            proxy.rewrite_response(3, 1, odd[:-2])
        # a real client's Metadata through the proxy: rewritten, no note
        await roundtrip_async("kafka-python", "%s:%d" % proxy.address, ["v"],
                              topic="exact", group="exact-g", timeout=20)
        await proxy.pipeline.drained()
        md = [f for f in rec.flows if f.api_name == "Metadata" and REWRITTEN in f.flags]
        assert md and not any(f.notes for f in md)
        for f in md:
            assert f.response_sent != f.response
            # Metadata's broker addresses are its Brokers array (MetadataResponse.json):
            # the broker named itself, Tansu, and the client was pointed at the proxy,
            # the same broker ids in the same order
            was = [(b.NodeId, b.Host, b.Port)
                   for b in c.decode_response(f.response, 3, f.api_version).body.Brokers]
            got = [(b.NodeId, b.Host, b.Port)
                   for b in c.decode_response(f.response_sent, 3, f.api_version).body.Brokers]
            assert {(h, p) for _, h, p in was} == {(host, int(port))}, was
            assert got == [(node, proxy.advertised_host(), proxy.address[1])
                           for node, _, _ in was], got
