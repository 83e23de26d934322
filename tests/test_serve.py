"""Serve: a capture of a real session answers the same real client code, without a broker.

The recording is made like in test_replay (kafka-python round trip through the
real proxy in front of a real Tansu broker); then the broker is gone and
``kinspect serve`` (a subprocess, and :class:`CaptureBroker` in-process) answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clients import roundtrip, roundtrip_async
from proxyutil import codec, exchange, record_session, request_bytes

from kinspect.brokers import TansuBroker, free_port
from kinspect.codec.protocol import Request
from kinspect.replay import load_flows
from kinspect.serve import CaptureBroker

VALUES = [f"served value {i} ✓" for i in range(5)]
TOPIC, GROUP = "served", "served-g"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "session.jsonl"
    with TansuBroker() as broker:
        consumed = asyncio.run(record_session(path, broker, VALUES, TOPIC, GROUP))
    assert consumed == VALUES
    return path


def _wait_listening(port: int, proc: subprocess.Popen, deadline: float) -> bool:
    """Poll until ``port`` accepts connections; False if the process exited or the
    deadline passed."""
    while proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM ``proc`` (its process group if it does not exit in 10 s: SIGKILL);
    its stdout and stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def test_same_client_code_reads_the_same_records_from_kinspect_serve(recorded):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinspect", "serve", str(recorded), "--listen", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    consumed = None
    try:
        ready = _wait_listening(port, proc, time.monotonic() + 20)
        if ready:
            consumed = roundtrip("kafka-python", f"127.0.0.1:{port}", VALUES, topic=TOPIC,
                                 group=GROUP, timeout=20)
    finally:
        _, err = _stop(proc)
    assert ready, f"kinspect serve did not listen on {port} (exit {proc.returncode}):\n{err}"
    assert consumed == VALUES
    assert proc.returncode == 0, err
    assert f"on 127.0.0.1:{port}" in err
    assert " 0 unmatched" in err and " 0 error(s)" in err, err


def test_kcat_reads_its_records_from_serve_of_its_own_capture(tmp_path):
    """kcat (librdkafka 2.0) served a capture of its own session against noida-db
    produces and consumes as it did when recorded. librdkafka looks for old versions
    in the broker's ranges to tell what it can do (Fetch v4, Produce v3: the v2
    message format); serve offered Fetch at the recorded 11-11 only, and kcat sent
    no Fetch at all and waited until killed."""
    from kinspect.brokers import NoidaBroker

    values = [f"kcat value {i}" for i in range(3)]
    path = tmp_path / "kcat.jsonl"
    with NoidaBroker() as broker:
        consumed = asyncio.run(record_session(path, broker, values, "kcat-served", "kcat-g",
                                              client="kcat"))
    assert consumed == values
    flows = load_flows(path, codec())
    fetch = {f.api_version for f in flows if f.api_name == "Fetch"}
    assert fetch and min(fetch) > 4, fetch  # (what made the bug: Fetch v4 not recorded)

    async def served():
        async with CaptureBroker(codec(), flows) as broker:
            got = await roundtrip_async("kcat", "%s:%d" % broker.address, values,
                                        topic="kcat-served", group="kcat-g", timeout=30)
        return got, broker.served

    consumed, log = asyncio.run(served())
    assert consumed == values
    assert any(e["api"] == "Fetch" and e["tier"] for e in log), log
    assert not [e for e in log if e["tier"] in (None, "unmatched")], log


async def test_in_process_serve_matches_every_request(recorded):
    flows = load_flows(recorded, codec())
    async with CaptureBroker(codec(), flows) as broker:
        consumed = await roundtrip_async("kafka-python", "%s:%d" % broker.address, VALUES,
                                         topic=TOPIC, group=GROUP, timeout=20)
    assert consumed == VALUES
    tiers = {(e["api"], e["tier"]) for e in broker.served}
    assert not [e for e in broker.served if e["tier"] in (None, "unmatched")], broker.served
    # the re-run producer's records carry new timestamps: equal only after ignoring them
    assert ("Produce", "normalized") in tiers
    # the consumer's first Fetch is byte-for-byte the recorded one
    first_fetch = next(e for e in broker.served if e["api"] == "Fetch")
    assert first_fetch["tier"] == "exact" and not first_fetch["reused"]
    recorded_fetches = [f.id for f in flows if f.api_name == "Fetch"]
    assert first_fetch["flow"] == recorded_fetches[0]


async def test_addresses_point_at_the_serving_listener(recorded):
    flows = load_flows(recorded, codec())
    recorded_port = next(f for f in flows if f.api_name == "Metadata"
                         ).response_decoded.body.Brokers[0].Port
    async with CaptureBroker(codec(), flows) as broker:
        host, port = broker.address
        assert port != recorded_port
        meta = next(f for f in flows if f.api_name == "Metadata")
        frame = meta.request[:4] + struct.pack(">i", 77) + meta.request[8:]
        (resp,) = await exchange(host, port, [frame])
    body = codec().decode_response(resp, meta.api_key, meta.api_version)
    assert body.correlation_id == 77
    assert [(b.Host, b.Port) for b in body.body.Brokers] == [(host, port)]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
async def test_api_versions_at_another_version_than_recorded(recorded, version):
    flows = load_flows(recorded, codec())
    rec = next(f for f in flows if f.api_name == "ApiVersions")
    assert rec.api_version != version
    # serve advertises what it can answer: each recorded api's highest version the
    # highest recorded, its lowest the broker's (that serve can decode); apis never
    # recorded are left out,
    # but for Heartbeat (12), answered without a recording at the broker's range
    used: dict[int, set[int]] = {}
    for f in flows:
        if f.api_key >= 0 and f.response is not None:
            used.setdefault(f.api_key, set()).add(f.api_version)
    assert 12 not in used
    def lowest(k):  # the broker's, within the versions serve's specs decode
        known = codec().registry.request(k.ApiKey).valid_versions.lowest
        return min(max(k.MinVersion, known), min(used[k.ApiKey]))

    want = [(k.ApiKey, lowest(k), max(used[k.ApiKey])) if k.ApiKey not in (12, 18)
            else (k.ApiKey, k.MinVersion, k.MaxVersion)
            for k in rec.response_decoded.body.ApiKeys if k.ApiKey in used or k.ApiKey == 12]
    assert 12 in [k for k, _, _ in want]
    assert len(want) < len(rec.response_decoded.body.ApiKeys)
    async with CaptureBroker(codec(), flows) as broker:
        body = ({} if version < 3 else
                {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"})
        (resp,) = await exchange(*broker.address, [request_bytes(18, version, 5, **body)])
    got = codec().decode_response(resp, 18, version)
    assert got.correlation_id == 5 and got.body.ErrorCode == 0
    assert [(k.ApiKey, k.MinVersion, k.MaxVersion) for k in got.body.ApiKeys] == want


@pytest.mark.parametrize("as_sent", [True, False])
async def test_answers_are_what_the_recorded_client_got_unless_asked_otherwise(
        recorded, as_sent):
    """A response the proxy changed on its way (a rule's strip, say: recorded with
    ``frame_sent``) is served as the recorded client got it, so a client that only
    worked through the rule works against ``serve`` too; ``as_sent=False``
    (``--as-received``) serves the broker's bytes. (serve answered with the broker's
    bytes only: kcat, which needs ``--strip`` to talk to Tansu, failed against it.)"""
    c = codec()
    flows = load_flows(recorded, c)
    rec = next(f for f in flows if f.api_name == "ApiVersions")
    changed = c.decode_response(rec.response, rec.api_key, rec.api_version)
    assert changed.body.ThrottleTimeMs == 0
    changed.body.ThrottleTimeMs = 7
    rec.response_sent = c.encode_response(changed)
    other = 2 if rec.api_version != 2 else 1  # (a version the recording did not use)
    async with CaptureBroker(c, flows, as_sent=as_sent) as broker:
        (resp, again) = await exchange(*broker.address,
                                       [rec.request, request_bytes(18, other, 9)])
    got = c.decode_response(resp, rec.api_key, rec.api_version)
    assert got.correlation_id == rec.correlation_id and got.body.ErrorCode == 0
    assert got.body.ThrottleTimeMs == (7 if as_sent else 0)
    got = c.decode_response(again, 18, other)  # (re-encoded at the client's version)
    assert got.correlation_id == 9 and got.body.ThrottleTimeMs == (7 if as_sent else 0)


def test_an_untimed_flow_is_served_and_replayed_without_a_recorded_latency(recorded):
    """A flow whose capture lines gave no time (``untimed``) has no latency: serve
    waits for its JoinGroup or a reused answer as for one of no known latency, and
    replay reports none (both used the times as they were: 0 for the missing one,
    some 1.8e12 ms after it)."""
    from kinspect.flows import UNTIMED
    from kinspect.replay import FlowResult

    flows = load_flows(recorded, codec())
    f = next(f for f in flows if f.api_name == "Metadata")
    f.request_ns = 0
    f.flags.add(UNTIMED)
    assert f.latency_ns is None
    assert FlowResult(f).to_dict()["recorded_latency_ms"] is None
    req = codec().decode_request(request_bytes(3, 12, 1, Topics=None))
    assert CaptureBroker._reuse_delay(req, f) == 0.0


async def test_api_versions_newer_than_any_spec_gets_v0_unsupported_version(recorded):
    flows = load_flows(recorded, codec())
    frame = struct.pack(">hhi", 18, 99, 6) + struct.pack(">h", 1) + b"t"
    async with CaptureBroker(codec(), flows) as broker:
        (resp,) = await exchange(*broker.address, [frame])
    got = codec().decode_response(resp, 18, 0)  # KIP-511: a v0 body
    assert got.body.ErrorCode == 35
    assert {k.ApiKey for k in got.body.ApiKeys} >= {0, 1, 3, 18}
    assert 26 not in {k.ApiKey for k in got.body.ApiKeys}  # never recorded: not offered


async def test_heartbeat_the_capture_never_saw_is_answered_with_success(recorded):
    """A member heartbeats on a timer: a replay slower than the recording sends
    Heartbeats it never saw. Each version the recorded broker offered is answered
    ErrorCode 0 with the client's correlation id, counted as synthesized."""
    c = codec()
    flows = load_flows(recorded, c)
    assert not [f for f in flows if f.api_name == "Heartbeat"]
    offered = next(k for k in next(f for f in flows if f.api_name == "ApiVersions")
                   .response_decoded.body.ApiKeys if k.ApiKey == 12)
    versions = range(offered.MinVersion, offered.MaxVersion + 1)
    assert len(versions) > 1
    frames = [request_bytes(12, v, 40 + v, GroupId=GROUP, GenerationId=1, MemberId="m")
              for v in versions]
    async with CaptureBroker(c, flows) as broker:
        answers = await exchange(*broker.address, frames)
    for v, resp in zip(versions, answers):
        got = c.decode_response(resp, 12, v)
        assert (got.correlation_id, got.body.ErrorCode) == (40 + v, 0)
    assert broker.stats.synthesized == len(versions) and broker.stats.unmatched == 0
    assert {e["tier"] for e in broker.served} == {"synthesized"}


async def test_heartbeat_offered_and_answered_only_where_serve_can_decode_it(recorded):
    """The recorded broker's Heartbeat range is offered within the versions the specs
    know (a broker offering v99: up to the spec's highest, else a client picking v99
    would be disconnected); a Heartbeat whose body does not decode is no group
    member's heartbeat: unmatched, not answered with success."""
    c = codec()
    flows = load_flows(recorded, c)
    rec = next(f for f in flows if f.api_name == "ApiVersions")
    resp = c.decode_response(rec.response, 18, rec.api_version)
    hb = next(k for k in resp.body.ApiKeys if k.ApiKey == 12)
    hb.MaxVersion = 99
    rec.response = c.encode_response(resp)
    rec.response_decoded = resp
    known = c.registry.request(12).valid_versions
    bad_body = request_bytes(12, known.highest, 8, GroupId=GROUP, GenerationId=1,
                             MemberId="m")[:-3]
    async with CaptureBroker(c, flows) as broker:
        (answer, bad) = await exchange(*broker.address, [rec.request, bad_body])
    offered = next(k for k in c.decode_response(answer, 18, rec.api_version).body.ApiKeys
                   if k.ApiKey == 12)
    assert (offered.MinVersion, offered.MaxVersion) == (hb.MinVersion, known.highest)
    assert c.decode_response(bad, 12, known.highest).body.ErrorCode == -1
    assert [e["tier"] for e in broker.served if e["api"] == "Heartbeat"] == ["unmatched"]
    assert broker.stats.synthesized == 0


async def test_join_and_sync_group_wait_as_the_recorded_broker_did(recorded, monkeypatch):
    """A JoinGroup or SyncGroup answer is held for the time the recorded broker took
    (at most 5 s), the first time it is served; served again, it waits as any reused
    answer does (at most 1 s). The waits asked of asyncio.sleep are recorded, not
    timed."""
    import kinspect.serve as serve

    flows = load_flows(recorded, codec())
    join = next(f for f in flows if f.api_name == "JoinGroup" and f.error_code == 0)
    sync = next(f for f in flows if f.api_name == "SyncGroup")
    join.response_ns = join.request_ns + 12 * 10**9  # longer than the cap
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay, *a, **k):
        waits.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(serve.asyncio, "sleep", sleep)
    async with CaptureBroker(codec(), flows) as broker:
        # (the second JoinGroup is answered by the other recorded one, the third reuses)
        await exchange(*broker.address, [join.request, sync.request] + [join.request] * 2)
    by_id = {f.id: f for f in flows}
    assert [e["reused"] for e in broker.served] == [False, False, False, True]
    latency = [(by_id[e["flow"]].response_ns - by_id[e["flow"]].request_ns) / 1e9
               for e in broker.served]
    assert waits[:3] == [5.0, latency[1], latency[2]] and 0 < latency[1] < 5
    assert len(waits) == 4 and 0 < waits[3] <= 1.0


async def test_a_consumer_that_heartbeats_stays_in_its_group(recorded):
    """kafka-python heartbeating every 20 ms through serve (the recording saw no
    Heartbeat), polling for a second after it consumed (so it heartbeats however
    fast the machine): it consumes and commits without rejoining its group.

    Before Heartbeat was answered, kafka-python found it missing from ApiVersions,
    marked the coordinator dead and rejoined. Before JoinGroup waited as long as
    the recorded broker did (3 s), kafka-python computed its assignment before its
    Metadata named the topic, and rejoined once it did. Either way commit() raised
    RebalanceInProgressError (in some runs of a consumer that commits at once; in
    every run of this one)."""
    flows = load_flows(recorded, codec())
    joins = [f.id for f in flows if f.api_name == "JoinGroup"]
    async with CaptureBroker(codec(), flows) as broker:
        consumed = await roundtrip_async("kafka-python", "%s:%d" % broker.address, VALUES,
                                         topic=TOPIC, group=GROUP, timeout=20,
                                         heartbeat_interval_ms=20, stay_s=1.0)
    assert consumed == VALUES
    beats = [e for e in broker.served if e["api"] == "Heartbeat"]
    assert beats and {e["tier"] for e in beats} == {"synthesized"}, broker.served
    assert [e["flow"] for e in broker.served if e["api"] == "JoinGroup"] == joins
    assert not [e for e in broker.served if e["tier"] in (None, "unmatched")], broker.served


def _request(api_key: int, version: int, corr: int, body) -> bytes:
    c = codec()
    return c.encode_request(Request(api_key, version, corr, "t",
                                    c.request_header_version(api_key, version), None, body, 0,
                                    c.api_name(api_key)))


async def test_unmatched_requests_get_error_responses_or_a_disconnect(recorded):
    c = codec()
    flows = load_flows(recorded, c)
    meta_versions = {f.api_version for f in flows if f.api_name == "Metadata"}
    assert 1 not in meta_versions
    topic_cls = c.request_codec(3).cls._spec.field("Topics").struct.cls
    meta_v1 = _request(3, 1, 11, c.request_codec(3).cls(Topics=[topic_cls(Name=TOPIC)]))
    meta_all_v1 = _request(3, 1, 12, c.request_codec(3).cls(Topics=None))
    describe_groups = _request(15, 0, 13, c.request_codec(15).cls(Groups=[GROUP, "other"]))
    async with CaptureBroker(c, flows) as broker:
        addr = broker.address
        # Metadata v1 (recorded only at other versions): per-topic UNSUPPORTED_VERSION
        (resp,) = await exchange(*addr, [meta_v1])
        body = c.decode_response(resp, 3, 1).body
        assert [(t.Name, t.ErrorCode) for t in body.Topics] == [(TOPIC, 35)]
        # DescribeGroups was never recorded: UNKNOWN_SERVER_ERROR per group
        (resp,) = await exchange(*addr, [describe_groups])
        body = c.decode_response(resp, 15, 0).body
        assert [(g.GroupId, g.ErrorCode) for g in body.Groups] == [(GROUP, -1), ("other", -1)]
        # Metadata for all topics has nowhere to carry an error: clean disconnect
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(struct.pack(">i", len(meta_all_v1)) + meta_all_v1)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # garbage: an unknown api key, then a negative frame size
        for junk in (struct.pack(">ihhi", 8, 999, 0, 1), struct.pack(">i", -5)):
            reader, writer = await asyncio.open_connection(*addr)
            writer.write(junk)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
        # and the server still answers
        rec = next(f for f in flows if f.api_name == "ApiVersions")
        (resp,) = await exchange(*addr, [rec.request])
        assert c.decode_response(resp, 18, rec.api_version).body.ErrorCode == 0
    assert broker.stats.unmatched == 3 and broker.stats.errors == 0
    assert broker.stats.disconnects == 3
    logged = [e for e in broker.served if e["tier"] == "unmatched"]
    assert [e["api"] for e in logged] == ["Metadata", "DescribeGroups", "Metadata"]
    assert "UNSUPPORTED_VERSION(35)" in logged[0]["error"]
    assert "no error field: disconnected" in logged[2]["error"]


async def test_successive_identical_requests_get_successive_recorded_responses(recorded):
    """Recorded ApiVersions/Metadata requests with equal bodies are served in recorded
    order, then the last one again."""
    c = codec()
    flows = load_flows(recorded, c)
    metas = [f for f in flows if f.api_name == "Metadata"]
    same = [f for f in metas if f.request_decoded.body == metas[0].request_decoded.body]
    assert len(same) >= 2
    async with CaptureBroker(c, flows) as broker:
        await exchange(*broker.address, [metas[0].request] * (len(same) + 1))
    served = [e for e in broker.served if e["api"] == "Metadata"]
    assert [e["flow"] for e in served] == [f.id for f in same] + [same[-1].id]
    assert [e["reused"] for e in served] == [False] * len(same) + [True]


def test_serve_banner_prints_the_capture_name_as_it_is(recorded, tmp_path):
    """``[red]`` in a file name is part of the name, not rich markup."""
    path = tmp_path / "run[red].jsonl"
    path.write_bytes(recorded.read_bytes())
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinspect", "serve", str(path), "--listen", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    try:
        ready = _wait_listening(port, proc, time.monotonic() + 20)
    finally:
        out, err = _stop(proc)
    assert ready, err
    assert f"from {path} on 127.0.0.1:{port}" in out + err, out + err


async def test_wildcard_ipv6_listener_advertises_an_address_it_accepts(recorded):
    """Listening on ``::`` (asyncio makes it IPv6-only), the broker addresses served
    must be reachable: ::1, not 127.0.0.1. A real client bootstraps on [::1] and
    follows them (tests listen on loopback only: ``::1``, where ``::`` advertises)."""
    flows = load_flows(recorded, codec())
    assert CaptureBroker(codec(), flows, ("::", 0)).address[0] == "::1"
    async with CaptureBroker(codec(), flows, ("::1", 0)) as broker:
        port = broker.address[1]
        consumed = await roundtrip_async("kafka-python", f"[::1]:{port}", VALUES, topic=TOPIC,
                                         group=GROUP, timeout=20)
    assert consumed == VALUES
    assert not [e for e in broker.served if e["tier"] in (None, "unmatched")], broker.served


async def test_any_free_port_on_every_address_is_one_port(recorded):
    """Port 0 on several addresses (the wildcard ``""``, a name with IPv4 and IPv6
    addresses; here the two loopback addresses, tests listen on loopback only): one
    socket per address; each must listen on the port advertised, whichever family a
    client reaches it by."""
    flows = load_flows(recorded, codec())
    rec = next(f for f in flows if f.api_name == "ApiVersions")
    async with CaptureBroker(codec(), flows, (["127.0.0.1", "::1"], 0),
                             advertise_host="127.0.0.1") as broker:
        port = broker.address[1]
        families = {s.family: s.getsockname()[1] for s in broker._server.sockets}
        assert len(families) == 2, "no socket on ::1: no IPv6 loopback on this machine?"
        assert set(families.values()) == {port}
        for addr in ("127.0.0.1", "::1"):
            (resp,) = await exchange(addr, port, [rec.request])
            assert codec().decode_response(resp, 18, rec.api_version).body.ErrorCode == 0


def test_serve_refuses_stdin_as_a_capture_like_replay(capsys):
    """``-`` is no file: refused with the reason at argument parsing (exit 2), as
    ``kinspect replay`` and ``show`` do, not reported as a missing file named "-"."""
    from kinspect import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "-", "--listen", "127.0.0.1:0"])
    assert exc.value.code == 2
    assert "not from stdin" in capsys.readouterr().err


def test_records_of_one_request_are_decoded_within_one_budget():
    """Matching normalizes a client's Produce records by decoding them, on the event
    loop: 5.6 KB of zstd (9.5 million empty records) held it 88 s and 2.3 GB. The
    records fields of one body share one budget (``DEFAULT_MAX_RECORDS`` records):
    past it a field is compared as bytes, and nothing is built for it."""
    import cramjam
    import crc32c

    from kinspect.codec.records import DEFAULT_MAX_RECORDS
    from kinspect.replay import DEFAULT_IGNORE, IgnoreRules
    from kinspect.serve import _normalize

    n = DEFAULT_MAX_RECORDS * 3 // 4
    comp = bytes(cramjam.zstd.compress(bytes([12, 0, 0, 0, 1, 1, 0]) * n, level=19))
    body = struct.pack(">hiqqqhii", 4, n - 1, 0, 0, -1, -1, -1, n) + comp  # zstd, count n
    after = struct.pack(">iB", 0, 2) + struct.pack(">I", crc32c.crc32c(body)) + body
    batch = struct.pack(">qi", 0, len(after)) + after
    c = codec()
    cls = c.request_codec(0).cls
    req = cls.from_dict({"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": None},
                                        {"Index": 1, "Records": None}]}]})
    for p in req.TopicData[0].PartitionData:
        p.Records = batch
    norm = _normalize(req, "Produce", IgnoreRules(DEFAULT_IGNORE))
    parts = norm[[f.name for f in cls._spec.fields].index("TopicData")][0][-1]
    first, second = (p[-1] for p in parts)
    assert isinstance(first, tuple) and len(first) == n  # decoded: (key, value, headers)
    assert second == batch  # the budget was spent: compared as bytes
