"""Replay: a real session recorded through the real proxy, sent again to real Tansu brokers.

The recording (module fixture) is a kafka-python round trip (admin creates the
topic, an idempotent producer writes, a consumer group reads and commits) through
:class:`kinspect.proxy.server.Proxy` with :class:`kinspect.capture.CaptureWriter`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from proxyutil import codec, freeze, record_session, request_bytes

from kinspect import cli
from kinspect.brokers import TansuBroker
from kinspect.capture import CaptureWriter, load_capture
from kinspect.codec.records import decode_records
from kinspect.proxy.server import Proxy, ProxyConfig
from kinspect.replay import (
    DEFAULT_IGNORE,
    IdMapper,
    IgnoreRules,
    Replayer,
    diff_structs,
    load_flows,
)

VALUES = [f"replay value {i}" for i in range(6)]
TOPIC, GROUP = "replayed", "replayed-g"
#: Apis whose answers depend only on the broker's state, which the replay rebuilds.
IDEMPOTENT = {"ApiVersions", "Metadata", "FindCoordinator", "ListOffsets", "OffsetFetch", "Fetch",
              "DescribeGroups", "DescribeConfigs"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``(capture path, consumed values)`` of one recorded session."""
    path = tmp_path_factory.mktemp("replay") / "session.jsonl"
    with TansuBroker() as broker:
        consumed = asyncio.run(record_session(path, broker, VALUES, TOPIC, GROUP))
    return path, consumed


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


def _flows_by_api(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in report["flows"]:
        out.setdefault(f["api"], []).append(f)
    return out


def test_recording_is_a_real_session(recorded):
    path, consumed = recorded
    assert consumed == VALUES
    apis = {f.api_name for f in load_flows(path, codec())}
    assert {"JoinGroup", "SyncGroup", "InitProducerId", "Produce", "Fetch",
            "OffsetCommit"} <= apis


def test_replay_against_fresh_tansu(recorded, tansu, tmp_path):
    """The idempotent APIs match; handed-out ids are carried forward; every
    difference is explained."""
    path, _ = recorded
    report_path = tmp_path / "report.json"
    rc = run_cli("replay", str(path), "--upstream", tansu.bootstrap, "--as-fast-as-possible",
                 "--timeout", "15", "--report", str(report_path))
    report = json.loads(report_path.read_text())
    by_api = _flows_by_api(report)
    assert report["summary"]["failed"] == 0, report["summary"]
    assert rc == (0 if report["summary"]["differing"] == 0 else 1)

    idempotent = [f for f in report["flows"] if f["api"] in IDEMPOTENT]
    assert {"ApiVersions", "Metadata", "FindCoordinator", "Fetch", "ListOffsets",
            "OffsetFetch"} <= {f["api"] for f in idempotent}
    assert [f for f in idempotent if f["status"] != "matched"] == []

    # the fresh broker listens elsewhere: the address differs and is ignored as volatile
    meta_ignored = {d["path"] for f in by_api["Metadata"] for d in f["ignored"]}
    assert "Brokers[0].Port" in meta_ignored

    # the member id the fresh broker handed out went into the later group requests
    member = [m for m in report["mappings"] if m["kind"] == "member"]
    assert member, report["mappings"]
    new_id = member[0]["replayed"]
    for api in ("SyncGroup", "OffsetCommit", "LeaveGroup"):
        for f in by_api[api]:
            assert any(new_id in r for r in f["request_rewrites"]), (api, f["request_rewrites"])
            assert f["status"] == "matched", f

    # the consumer's Fetch got the records the producer's Produce wrote, in the fresh broker
    fetched = [f for f in by_api["Fetch"] if f["status"] == "matched"]
    assert fetched

    for f in report["flows"]:
        if f["status"] in ("differing", "failed"):
            assert f["explanation"], f
            assert all(d.get("explanation") for d in f["diffs"]), f


def test_replay_against_a_used_broker_explains_every_difference(recorded, tansu):
    """Replaying twice into one broker: the second run finds the topic, records and
    commits of the first; the producer id the broker hands out is new, so record
    batches are patched (CRC recomputed) and still accepted."""
    path, _ = recorded
    first = asyncio.run(Replayer(codec(), load_flows(path, codec()), (tansu.host, tansu.port),
                                 speed=None, timeout=15).run())
    assert first.counts()["failed"] == 0
    second = asyncio.run(Replayer(codec(), load_flows(path, codec()), (tansu.host, tansu.port),
                                  speed=None, timeout=15).run())
    c = second.counts()
    assert c["failed"] == 0 and c["differing"] > 0, c

    create = next(r for r in second.results if r.flow.api_name == "CreateTopics")
    assert create.status == "differing"
    assert [(d.kind, d.replayed) for d in create.diffs if d.kind == "error-code"] == \
        [("error-code", 36)]
    assert "TOPIC_ALREADY_EXISTS(36)" in create.explanation

    produces = [r for r in second.results if r.flow.api_name == "Produce"]
    assert produces
    for r in produces:
        assert any("CRC recomputed" in w for w in r.rewrites), r.rewrites
        assert not [d for d in r.diffs if d.kind == "error-code"], r.diffs  # accepted
        assert [d.path.rsplit(".", 1)[1] for d in r.diffs] == ["BaseOffset"]
        assert "another offset" in r.diffs[0].explanation

    differing = second.by_status("differing")
    assert {"Fetch", "OffsetFetch"} <= {r.flow.api_name for r in differing}
    first = differing[0]
    assert "no earlier flow of this replay explains it" in first.explanation
    for r in differing:
        assert r.explanation, r.flow
        assert all(d.explanation for d in r.diffs), r.flow
        if r is not first:
            assert f"from the start (first seen in flow #{first.flow.id}" in r.explanation
        if r.flow.api_name in ("Fetch", "OffsetFetch"):
            assert "earlier state-changing flows on the same topic or group" in r.explanation


def test_unmapped_member_id_is_reported(recorded, tansu, tmp_path):
    """Without the JoinGroup flows the broker never hands out a member id: the
    later group requests carry the recorded one, and the report says so."""
    path, _ = recorded
    flows = load_flows(path, codec())
    first_join = min(f.id for f in flows if f.api_name == "JoinGroup")
    report_path = tmp_path / "report.json"
    rc = run_cli("replay", str(path), "--upstream", tansu.bootstrap, "--as-fast-as-possible",
                 "--timeout", "15", "--filter", "!~api JoinGroup", "--report", str(report_path))
    assert rc == 1
    report = json.loads(report_path.read_text())
    by_api = _flows_by_api(report)
    assert all(f["status"] == "skipped" and "filter" in f["explanation"]
               for f in by_api["JoinGroup"])
    for api in ("SyncGroup", "LeaveGroup"):
        for f in by_api[api]:
            assert f["status"] == "differing", f
            kinds = {(u["kind"], u["issued_by"]) for u in f["unmapped"]}
            assert ("member", first_join) in kinds, f["unmapped"]
            assert f"recorded flow #{first_join}, which was not replayed" in f["explanation"]
            assert any(d["kind"] == "error-code" for d in f["diffs"])


def test_unreachable_broker_fails_every_flow(recorded, free_port):
    path, _ = recorded
    report = asyncio.run(Replayer(codec(), load_flows(path, codec()), ("127.0.0.1", free_port),
                                  speed=None, timeout=5, connect_timeout=5).run())
    c = report.counts()
    assert c["failed"] == len(report.results) and c["matched"] == 0
    assert all("cannot connect" in r.explanation for r in report.results)


async def _client(address, batches) -> None:
    """A minimal client: each batch of request frames is written at once (pipelined),
    then its responses are read."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        for batch in batches:
            writer.write(b"".join(len(f).to_bytes(4, "big") + f for f in batch))
            await writer.drain()
            for _ in batch:
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
                await asyncio.wait_for(reader.readexactly(size), 10)
    finally:
        writer.close()


def _dir_sequences(path) -> dict[int, list[tuple[str, str]]]:
    out: dict[int, list[tuple[str, str]]] = {}
    for ref in load_capture(path, codec()).frames:
        out.setdefault(ref.flow.conn, []).append((ref.dir, ref.flow.api_name))
    return out


async def test_replay_keeps_the_recorded_pipelining(tansu, tmp_path):
    """Requests the client pipelined are sent pipelined again; a request sent after a
    response waits for that response again (observed through the real proxy)."""
    host, port = tansu.bootstrap.rsplit(":", 1)
    upstream = (host, int(port))
    batches = [[request_bytes(18, 3, 1, ClientSoftwareName="t", ClientSoftwareVersion="1"),
                request_bytes(3, 9, 2, Topics=None)],
               [request_bytes(3, 9, 3, Topics=None)]]

    async def through_proxy(path, work) -> None:
        proxy = Proxy(ProxyConfig(upstream=upstream), codec())
        proxy.pipeline.add(CaptureWriter(path, codec(), upstream=tansu.bootstrap))
        await proxy.start()
        try:
            await work(proxy.address)
        finally:
            await proxy.close()

    original, replayed = tmp_path / "original.jsonl", tmp_path / "replayed.jsonl"
    await through_proxy(original, lambda addr: _client(addr, batches))
    want = [("req", "ApiVersions"), ("req", "Metadata"), ("resp", "ApiVersions"),
            ("resp", "Metadata"), ("req", "Metadata"), ("resp", "Metadata")]
    assert list(_dir_sequences(original).values()) == [want]

    reports = []

    async def replay(addr):
        reports.append(await Replayer(codec(), load_flows(original, codec()), addr, speed=None,
                                      timeout=10).run())

    await through_proxy(replayed, replay)
    assert reports[0].counts()["matched"] == 3
    assert list(_dir_sequences(replayed).values()) == [want]


# -- codec-level pieces, on the recorded frames ------------------------------------

def test_patch_records_rewrites_producer_id_and_crc(recorded):
    path, _ = recorded
    produce = next(f for f in load_flows(path, codec()) if f.api_name == "Produce")
    records = produce.request_decoded.body.TopicData[0].PartitionData[0].Records
    before = decode_records(records).batches[0]
    assert before.crc_valid and before.producer_id >= 0
    mapper = IdMapper()
    mapper.mapping[("producer", None, before.producer_id)] = 4242
    mapper.mapping[("producer-epoch", before.producer_id, before.producer_epoch)] = 7
    patched, notes = mapper.patch_records(records, "Records")
    after = decode_records(patched).batches[0]
    assert (after.producer_id, after.producer_epoch) == (4242, 7)
    assert after.crc_valid and after.crc != before.crc
    assert [r.value for r in after.records] == [r.value for r in before.records]
    assert notes and "CRC recomputed" in notes[0]


def test_diff_ignores_volatile_fields_and_reports_others(recorded):
    path, _ = recorded
    meta = [f for f in load_flows(path, codec()) if f.api_name == "Metadata"
            and f.response_decoded.body.Topics]
    a = meta[0].response_decoded.body
    b = a.copy()
    b.Brokers[0].Port += 1
    b.ThrottleTimeMs = 5
    b.Topics[0].Partitions[0].ErrorCode = 3
    diffs = diff_structs(a, b, "Metadata", IgnoreRules(DEFAULT_IGNORE))
    ignored = {d.path: d.rule for d in diffs if d.rule}
    counted = [(d.path, d.kind, d.recorded, d.replayed) for d in diffs if not d.rule]
    assert ignored == {"Brokers[0].Port": "Port", "ThrottleTimeMs": "ThrottleTimeMs"}
    assert counted == [("Topics[0].Partitions[0].ErrorCode", "error-code", 0, 3)]
    # user patterns: dotted paths, api-scoped names, groups
    rules = IgnoreRules(["Topics.Partitions.ErrorCode"])
    assert rules.match("Metadata", "Topics.Partitions.ErrorCode") is not None
    assert IgnoreRules(["Fetch:HighWatermark"]).match("Metadata", "HighWatermark") is None
    assert IgnoreRules(["offsets"]).match("Fetch", "Responses.Partitions.HighWatermark")


def test_redacted_authentication_is_skipped_with_a_reason(tmp_path, free_port):
    """A capture made without --capture-secrets holds markers, not credentials:
    replay must not send them as if they were."""
    from kinspect.capture import CaptureWriter
    from kinspect.codec.protocol import Response
    from kinspect.flows import Flow

    c = codec()
    req = request_bytes(36, 2, 7, AuthBytes=b"\x00alice\x00secret")
    cls = c.response_codec(36).cls
    resp = c.encode_response(Response(36, 2, 7, 1, None, cls(ErrorCode=0, AuthBytes=b""), 0, "",
                                      2))
    flow = Flow(1, 1, "127.0.0.1:5", "127.0.0.1:9092", 36, 2, 7, "SaslAuthenticate", req, 1)
    flow.response, flow.response_ns = resp, 2
    path = tmp_path / "auth.jsonl"
    w = CaptureWriter(path, c, upstream="127.0.0.1:9092")
    w.on_request(flow)
    w.on_flow(flow)
    w.close()
    report = asyncio.run(Replayer(c, load_flows(path, c), ("127.0.0.1", free_port), speed=None,
                                  timeout=2, connect_timeout=2).run())
    [r] = report.results
    assert r.status == "skipped" and "redacted" in r.explanation


def _response(api_key: int, **fields):
    c = codec()
    spec = c.registry.response(api_key)
    return spec, c.registry.codec(spec).cls(**fields)


def test_keyed_arrays_pair_by_key_and_report_extra_elements():
    """ApiVersions' ApiKeys are keyed by ApiKey: a broker that knows one api more
    differs by one extra element, not by every element after it."""
    spec, _ = _response(18)
    K = spec.struct.field("ApiKeys").struct.cls

    def body(keys):
        return _response(18, ErrorCode=0, ApiKeys=[K(ApiKey=k, MinVersion=0, MaxVersion=k + 1)
                                                  for k in keys])[1]

    rules = IgnoreRules(DEFAULT_IGNORE)
    diffs = diff_structs(body([0, 1, 3, 8]), body([0, 1, 2, 3, 8]), "ApiVersions", rules)
    assert [(d.path, d.kind, d.replayed["ApiKey"]) for d in diffs] == [("ApiKeys[2]", "extra", 2)]
    diffs = diff_structs(body([0, 1, 3, 8]), body([8, 3, 0]), "ApiVersions", rules)
    assert [(d.path, d.kind, d.recorded["ApiKey"]) for d in diffs] == [("ApiKeys[1]", "missing",
                                                                       1)]
    # the same keys in another order: no difference at all
    assert diff_structs(body([0, 1, 3]), body([3, 0, 1]), "ApiVersions", rules) == []


def test_keyed_leftovers_pair_by_position():
    """Elements whose keys differ on both sides (another broker's node id) are still
    compared field by field, so volatile keys stay ignored."""
    spec, _ = _response(3)
    B = spec.struct.field("Brokers").struct.cls
    _, a = _response(3, Brokers=[B(NodeId=1, Host="a", Port=9092)], Topics=[])
    _, b = _response(3, Brokers=[B(NodeId=0, Host="b", Port=9093)], Topics=[])
    diffs = diff_structs(a, b, "Metadata", IgnoreRules(DEFAULT_IGNORE))
    assert {d.path for d in diffs} == {"Brokers[0].NodeId", "Brokers[0].Host", "Brokers[0].Port"}
    assert all(d.rule for d in diffs)


def test_topic_ids_are_learned_by_topic_name():
    """A replayed Metadata answer with one topic more must not map the recorded id of
    "orders" to the id of whatever topic comes first."""
    c = codec()
    spec, _ = _response(3)
    T = spec.struct.field("Topics").struct.cls
    A, B, X = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
    _, recorded = _response(3, Topics=[T(Name="orders", TopicId=A)])
    _, replayed = _response(3, Topics=[T(Name="audit", TopicId=X), T(Name="orders", TopicId=B)])
    mapper = IdMapper()
    mapper.learn(recorded, replayed, None, 1)
    fspec = c.registry.request(1)
    F = c.registry.codec(fspec).cls
    fetch = F(Topics=[fspec.struct.field("Topics").struct.cls(TopicId=A)])
    mapper.rewrite(fetch)
    assert fetch.Topics[0].TopicId == B
    # a topic that is only on one side teaches nothing, even at the same position
    _, other = _response(3, Topics=[T(Name="audit", TopicId=X)])
    fresh = IdMapper()
    assert fresh.learn(recorded, other, None, 1) == []
    assert fresh.mapping == {}


def test_response_without_its_request_is_not_replayed(tansu, tmp_path):
    """A rotated part that starts with the answer to a request of the part before:
    that flow is skipped with a reason, nothing is sent for it, the rest replays."""
    from kinspect.capture import read_capture
    from kinspect.codec.protocol import Response
    from kinspect.flows import Flow

    c = codec()
    cls = c.response_codec(3).cls
    flows = []
    for fid, corr in ((1, 4), (2, 5)):
        f = Flow(fid, 1, "127.0.0.1:5", tansu.bootstrap, 3, 12, corr, "Metadata",
                 request_bytes(3, 12, corr, Topics=None), 10 * fid)
        f.response = c.encode_response(Response(3, 12, corr, 1, None, cls(ClusterId="c"), 0, "",
                                                12))
        f.response_ns = 10 * fid + 5
        flows.append(f)
    whole = tmp_path / "whole.jsonl"
    w = CaptureWriter(whole, c, upstream=tansu.bootstrap)
    for f in flows:
        w.on_request(f)
        w.on_flow(f)
    w.close()
    part = tmp_path / "part.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in read_capture(whole)
                            if not (r.get("flow") == 1 and r.get("dir") == "req")))
    host, port = tansu.bootstrap.rsplit(":", 1)
    report = asyncio.run(Replayer(c, load_flows(part, c), (host, int(port)), speed=None,
                                  timeout=10).run())
    by_id = {r.flow.id: r for r in report.results}
    assert by_id[1].status == "skipped" and "request is not in the capture" in \
        by_id[1].explanation
    assert by_id[2].status not in ("skipped", "failed"), by_id[2].explanation


def test_unknown_tagged_fields_are_compared():
    """A tagged field no spec knows (KIP-482) that differs is a difference, at the
    top level and inside array elements; ``--ignore _unknown_tags`` hides it."""
    spec, _ = _response(18)
    K = spec.struct.field("ApiKeys").struct.cls

    def body(top, inner):
        return _response(18, ErrorCode=0, unknown_tags=top,
                         ApiKeys=[K(ApiKey=0, MinVersion=0, MaxVersion=9, unknown_tags=inner)])[1]

    rules = IgnoreRules(DEFAULT_IGNORE)
    assert diff_structs(body({9: b"\x01"}, None), body({9: b"\x01"}, None), "ApiVersions",
                        rules) == []
    diffs = diff_structs(body({9: b"\x01"}, {5: b"ab"}), body({9: b"\x02"}, None), "ApiVersions",
                         rules)
    assert [(d.path, d.kind, d.recorded, d.replayed, d.rule) for d in diffs] == [
        ("ApiKeys[0]._unknown_tags.5", "unknown-tag", "6162", None, None),
        ("_unknown_tags.9", "unknown-tag", "01", "02", None)]
    ignoring = IgnoreRules([*DEFAULT_IGNORE, "_unknown_tags"])
    assert all(d.rule for d in diff_structs(body({9: b"\x01"}, {5: b"ab"}),
                                            body({9: b"\x02"}, None), "ApiVersions", ignoring))


def test_redacted_request_values_are_not_sent_unless_asked(tmp_path, free_port):
    """An AlterConfigs recorded without --capture-secrets holds the redaction marker
    where the password was: replaying it would set the marker as the config value.
    It is skipped with a reason unless send_redacted; a flow whose *response* alone
    was redacted (DescribeConfigs) is replayed as usual."""
    from kinspect.codec.protocol import Response
    from kinspect.codec.values import struct_class
    from kinspect.flows import Flow

    c = codec()
    spec = c.request_codec(33).spec.struct
    res_cls = struct_class(spec.field("Resources").struct)
    cfg_cls = struct_class(spec.field("Resources").struct.field("Configs").struct)
    alter = request_bytes(33, 1, 1, Resources=[res_cls(
        ResourceType=2, ResourceName="t",
        Configs=[cfg_cls(Name="ssl.keystore.password", Value="hunter2")])], ValidateOnly=True)
    dspec = c.response_codec(32).spec.struct
    dres = struct_class(dspec.field("Results").struct)
    dcfg = struct_class(dspec.field("Results").struct.field("Configs").struct)
    describe_resp = c.encode_response(Response(32, 1, 2, 0, None, c.response_codec(32).cls(
        Results=[dres(ErrorCode=0, ResourceType=2, ResourceName="t", Configs=[
            dcfg(Name="ssl.keystore.password", Value="hunter2", ReadOnly=False,
                 ConfigSource=1, IsSensitive=False)])]), 0, "", 1))
    flows = []
    for fid, key, ver, corr, req, resp in (
            (1, 33, 1, 1, alter, None),
            (2, 32, 1, 2, request_bytes(32, 1, 2, Resources=[]), describe_resp)):
        f = Flow(fid, 1, "127.0.0.1:5", "127.0.0.1:9092", key, ver, corr, "", req, fid)
        f.response, f.response_ns = resp, None if resp is None else fid + 1
        flows.append(f)
    path = tmp_path / "cfg.jsonl"
    w = CaptureWriter(path, c, upstream="127.0.0.1:9092")
    for f in flows:
        w.on_request(f)
        w.on_flow(f)
    w.close()
    loaded = load_flows(path, c)
    assert b"hunter2" not in loaded[0].request and "redacted-request" in loaded[0].flags
    assert "redacted" in loaded[1].flags and "redacted-request" not in loaded[1].flags

    def run(**kw):
        rep = Replayer(c, load_flows(path, c), ("127.0.0.1", free_port), speed=None, timeout=2,
                       connect_timeout=2, **kw)
        return {r.flow.id: r for r in asyncio.run(rep.run()).results}

    by_id = run()
    assert by_id[1].status == "skipped" and "--send-redacted" in by_id[1].explanation
    assert by_id[2].status == "failed"  # sent (nothing listens there), not skipped
    assert run(send_redacted=True)[1].status == "failed"


def test_a_broker_that_stops_answering_costs_one_timeout_per_connection(recorded, tansu):
    """A request timeout closes its connection, like a client's: the flows still to
    come on it fail at once, they do not each wait out the timeout in turn
    (the broker is real and stopped, SIGSTOP: it accepts connections, never answers)."""
    import os
    import signal

    path, _ = recorded
    flows = load_flows(path, codec())
    freeze(tansu.pid)
    try:
        report = asyncio.run(Replayer(codec(), flows, (tansu.host, tansu.port), speed=None,
                                      timeout=1, connect_timeout=10).run())
    finally:
        os.kill(tansu.pid, signal.SIGCONT)
    assert report.counts()["failed"] == len(report.results)
    by_conn: dict[int, list] = {}
    for r in report.results:
        by_conn.setdefault(r.flow.conn, []).append(r)
    for conn, results in by_conn.items():
        first, *rest = sorted(results, key=lambda r: r.flow.request_ns)
        # each connection opens with a request answered before the next was sent
        assert first.error == "no response within 1 s", (conn, first.error)
        assert rest, conn
        for r in rest:
            assert r.error == (f"connection closed after flow #{first.flow.id} got no "
                               f"response within 1 s"), (conn, r.flow.id, r.error)
            assert r.correlation_id is None, (conn, r.flow.id)  # never sent


def _timed_flows(times) -> list:
    """ApiVersions flows ``(id, conn, request_ns, response_ns)``, in capture order."""
    from kinspect.flows import Flow

    out = []
    for fid, conn, req_ns, resp_ns in times:
        f = Flow(fid, conn, "127.0.0.1:5", "127.0.0.1:9092", 18, 3, fid, "ApiVersions",
                 request_bytes(18, 3, fid, ClientSoftwareName="t",
                               ClientSoftwareVersion="1"), req_ns)
        f.response, f.response_ns = b"\x00\x00\x00\x01\x00\x00", resp_ns
        out.append(f)
    return out


def _write_capture(path, flows, c):
    """A capture file of ``flows`` (each request and response at its recorded time)."""
    w = CaptureWriter(path, c, upstream="127.0.0.1:9092")
    for f in flows:
        w.write_frame(f, "req", f.request, None, f.request_ns)
        w.write_frame(f, "resp", f.response, None, f.response_ns)
    w.close()
    return path


def _assert_well_founded(flows, deps) -> None:
    """Every wait points to a flow earlier in capture order (so none is on itself and
    none can close a cycle); each connection sends in capture order."""
    seq = {f.id: n for n, f in enumerate(flows)}
    assert set(deps) == set(seq)
    for fid, waits in deps.items():
        assert all(seq[g] < seq[fid] for g in waits), (fid, waits)


def test_dependencies_follow_the_recorded_causality():
    """A request waits for the responses recorded before it, on any connection, and
    not for those recorded after it."""
    flows = _timed_flows([(1, 1, 10, 20), (2, 2, 30, 40), (3, 1, 35, 50), (4, 2, 45, 60)])
    deps = Replayer(codec(), flows, ("127.0.0.1", 1)).dependencies()
    # 3 does not wait for 2 (answered at 40, after 35); 4 not again for 1 (2 waited)
    assert deps == {1: [], 2: [1], 3: [1], 4: [2]}


def test_a_response_recorded_before_its_request_is_not_waited_for():
    """A wall clock stepped back between a request and its response (ts_ns of the
    response earlier than the request's) must not make the request wait for itself."""
    flows = _timed_flows([(1, 1, 100, 50)])
    deps = Replayer(codec(), flows, ("127.0.0.1", 1)).dependencies()
    assert deps == {1: []}


def test_stepped_clocks_never_make_a_dependency_cycle():
    """Whatever the timestamps (clocks stepped back and forth across connections),
    every wait points to an earlier flow in capture order, and the responses passed
    over on a connection are still waited for by its later requests."""
    import random

    rnd = random.Random(15)
    for _ in range(200):
        n = rnd.randint(1, 12)
        flows = _timed_flows([(i + 1, rnd.randint(1, 3), rnd.randint(0, 20), rnd.randint(0, 20))
                              for i in range(n)])
        deps = Replayer(codec(), flows, ("127.0.0.1", 1)).dependencies()
        _assert_well_founded(flows, deps)
        seq = {f.id: k for k, f in enumerate(flows)}
        by_conn: dict[int, list] = {}
        for f in flows:
            by_conn.setdefault(f.conn, []).append(f)
        for lst in by_conn.values():
            waited: set[int] = set()
            ts = None
            for f in lst:
                waited |= set(deps[f.id])
                ts = f.request_ns if ts is None else max(ts, f.request_ns)
                want = {g.id for g in flows if g.response_ns < ts and seq[g.id] < seq[f.id]}
                assert want <= waited, (f.id, want - waited)


def test_replay_of_a_response_recorded_before_its_request_ends(tmp_path, free_port):
    """The stepped clock case end to end, through a capture file: the replay ends
    (every flow fails, nothing listens) instead of waiting forever on itself."""
    c = codec()
    flows = _timed_flows([(1, 1, 100, 50), (2, 2, 200, 150), (3, 1, 300, 120),
                          (4, 2, 110, 400)])
    path = _write_capture(tmp_path / "stepped.jsonl", flows, c)
    loaded = load_flows(path, c)
    assert [(f.request_ns, f.response_ns) for f in loaded] == [(100, 50), (200, 150),
                                                               (300, 120), (110, 400)]
    rep = Replayer(c, loaded, ("127.0.0.1", free_port), speed=None, timeout=2,
                   connect_timeout=2)
    report = asyncio.run(asyncio.wait_for(rep.run(), 30))
    assert [r.status for r in report.results] == ["failed"] * 4


def test_max_gap_shortens_long_recorded_pauses_and_says_so():
    """``speed`` spaces requests as recorded; ``max_gap`` caps each pause between
    consecutive requests (after ``speed``) and moves what follows earlier, like
    tcpreplay's --maxsleep. A timestamp centuries ahead (a clock stepped forward)
    made ``--speed 1`` wait it out."""
    century = 100 * 365 * 86400 * 10**9
    flows = _timed_flows([(1, 1, 0, 10), (2, 2, 2 * 10**9, 2 * 10**9 + 10),
                          (3, 1, century, century + 10), (4, 2, century + 10**9, century + 20)])
    as_recorded = Replayer(codec(), flows, ("127.0.0.1", 1), speed=2.0)
    assert as_recorded.schedule() == {0: 0.0, 2 * 10**9: 1.0, century: century / 2e9,
                                      century + 10**9: century / 2e9 + 0.5}
    capped = Replayer(codec(), flows, ("127.0.0.1", 1), speed=2.0, max_gap=0.75)
    assert capped.schedule() == {0: 0.0, 2 * 10**9: 0.75, century: 1.5, century + 10**9: 2.0}
    assert sum("2 recorded pause(s)" in n and "0.75 s" in n for n in capped.notes) == 1
    capped.schedule()  # (the command asks first, to print the span)
    assert sum("max gap" in n for n in capped.notes) == 1
    assert not any("max gap" in n for n in as_recorded.notes)
    assert Replayer(codec(), flows, ("127.0.0.1", 1), speed=None, max_gap=1).schedule() == {}
    with pytest.raises(ValueError):
        Replayer(codec(), flows, ("127.0.0.1", 1), max_gap=-1)


def test_replay_with_max_gap_ends_despite_a_century_long_pause(tmp_path, tansu):
    """End to end through a capture file and the command: with ``--max-gap 0.2`` a
    capture whose second request is recorded a century after the first is replayed
    in well under a minute (both sent and answered), and the report notes it."""
    c = codec()
    century = 100 * 365 * 86400 * 10**9
    flows = _timed_flows([(1, 1, 0, 10), (2, 1, century, century + 10)])
    path = _write_capture(tmp_path / "gap.jsonl", flows, c)
    report_path = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kinspect", "replay", str(path), "--upstream",
                           tansu.bootstrap, "--timeout", "10", "--max-gap", "0.2",
                           "--report", str(report_path)], capture_output=True, text=True,
                          timeout=120)  # (without the cap it would wait a century)
    assert proc.returncode in (0, 1), proc.stderr  # (the recorded answers are made up)
    report = json.loads(report_path.read_text())
    assert len(report["flows"]) == 2
    assert all(f["status"] != "failed" for f in report["flows"]), report["flows"]
    assert any("shortened to 0.2 s" in n for n in report["notes"])


def test_an_unreachable_broker_is_one_error_from_the_command(recorded, free_port, tmp_path):
    """``kinspect replay`` against a broker that cannot be reached: one error line
    naming the address (``cannot connect to HOST:PORT: ...``), exit 1, nothing
    replayed and no report, not a table of failed flows and a message for each."""
    path, _ = recorded
    report_path = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "kinspect", "replay", str(path), "--upstream",
                           f"127.0.0.1:{free_port}", "--as-fast-as-possible",
                           "--report", str(report_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    # (exactly: no blank line before it, from a progress bar on a pipe)
    assert proc.stderr == (f"kinspect: error: cannot connect to 127.0.0.1:{free_port}: "
                           "[Errno 111] Connection refused\n"), proc.stderr
    assert not report_path.exists()


def test_check_upstream_raises_once_and_still_replays_a_reachable_broker(recorded, free_port,
                                                                         tansu):
    """``check_upstream``: the first connection is opened before anything is sent;
    failing, :meth:`Replayer.run` raises :class:`UpstreamError`; succeeding, the
    replay goes on as without it (its first connection reused)."""
    from kinspect.replay import UpstreamError

    path, _ = recorded
    with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{free_port}: "):
        asyncio.run(Replayer(codec(), load_flows(path, codec()), ("127.0.0.1", free_port),
                             speed=None, connect_timeout=5, check_upstream=True).run())
    report = asyncio.run(Replayer(codec(), load_flows(path, codec()), (tansu.host, tansu.port),
                                  speed=None, timeout=15, check_upstream=True).run())
    c = report.counts()
    assert c["failed"] == 0 and c["matched"] > 0, c
