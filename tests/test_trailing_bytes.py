"""Bytes after a message inside its frame.

Kafka's own parsers read a message's fields and do not look past them (the
broker's request parsing, the Java client's response parsing), so a frame with
bytes after its body is answered, and what its receiver acts on is the message
without them. librdkafka sends such frames (its Metadata request for all topics
in flexible versions, librdkafka issue 5049). kinspect decodes them as Kafka
reads them, keeps the bytes (``trailing``), writes them back when it re-encodes
the frame, and flags the flow ``trailing-bytes``; ``strict=True`` refuses them.
Expected bytes here are written by hand from the protocol guide.
"""

from __future__ import annotations

import pytest
from codec_util import corpus_codec, h
from proxyutil import codec, exchange, request_bytes, running_proxy

from kinspect.codec import DecodeError, Request, Response
from kinspect.filters import parse
from kinspect.flows import REWRITTEN, TRAILING, UNDECODED, Flow
from kinspect.proxy.pipeline import decode_flow
from kinspect.proxy.rules import RuleSet, parse_flag

EXTRA = h("01 00 00")

#: librdkafka 2.16's Metadata v12 request for all topics (AdminClient.list_topics):
#: header v2 (api key 3, version 12, correlation id 3, client id "rdkafka", no
#: header tags), then 00 Topics: compact array length 0 = null, 00
#: AllowAutoTopicCreation false, 00 IncludeTopicAuthorizedOperations false, 00 no
#: tags; then 01 00 00, which a broker does not read.
LIBRDKAFKA_METADATA = h("00 03 | 00 0c | 00 00 00 03 | 00 07") + b"rdkafka" + \
    h("00 | 00 | 00 | 00 | 00 | 01 00 00")


def _versions(spec):
    return range(spec.valid_versions.lowest, spec.valid_versions.highest + 1)


def _frames(c):
    """``(kind, api key, version, frame)`` of a default message of every request and
    response version of the Kafka corpus."""
    reg = c.registry
    for api_key in reg.api_keys():
        for v in _versions(reg.request(api_key)):
            body = c.request_codec(api_key).cls()
            req = Request(api_key, v, 7, "c", c.request_header_version(api_key, v), None,
                          body, 0, "")
            yield "request", api_key, v, c.encode_request(req)
        for v in _versions(reg.response(api_key)):
            body = c.response_codec(api_key).cls()
            resp = Response(api_key, v, 7, c.response_header_version(api_key, v), None, body,
                            0, "", v)
            yield "response", api_key, v, c.encode_response(resp)


def test_every_message_of_the_corpus_keeps_the_bytes_after_it():
    c = corpus_codec()
    checked = 0
    for kind, api_key, v, frame in _frames(c):
        if kind == "request":
            def decode(f, **kw):
                return c.decode_request(f, **kw)
            encode = c.encode_request
        else:
            def decode(f, **kw):
                return c.decode_response(f, api_key, v, **kw)
            encode = c.encode_response
        where = (kind, c.api_name(api_key), v)
        clean = decode(frame)
        assert clean.trailing == b"", where
        got = decode(frame + EXTRA)
        assert got.body == clean.body and got.header == clean.header, where
        assert got.trailing == EXTRA and got.to_dict()["trailing"] == "010000", where
        assert "trailing" not in clean.to_dict(), where
        assert encode(got) == frame + EXTRA, where
        with pytest.raises(DecodeError) as ei:
            decode(frame + EXTRA, strict=True)
        assert ei.value.offset == len(frame) and "3 trailing bytes" in ei.value.reason, where
        checked += 1
    assert checked > 600


def test_librdkafka_metadata_request_decodes_as_a_broker_reads_it():
    c = corpus_codec()
    req = c.decode_request(LIBRDKAFKA_METADATA)
    assert (req.api_name, req.api_version, req.correlation_id, req.client_id) == \
        ("Metadata", 12, 3, "rdkafka")
    assert req.body.Topics is None and req.body.AllowAutoTopicCreation is False
    assert req.body.IncludeTopicAuthorizedOperations is False
    assert req.trailing == h("01 00 00")
    assert c.encode_request(req) == LIBRDKAFKA_METADATA


def test_top_level_tags_of_a_response_with_bytes_after_it():
    """The proxy's KIP-951 check reads the tags a client reads: those of the body."""
    c = corpus_codec()
    # Produce v10 response, header v1: correlation id 9, no header tags; body: no
    # topics (compact array 01), ThrottleTimeMs 0, tag section with tag 0
    # (NodeEndpoints) holding an empty compact array (01): 01 | 00 01 01
    frame = h("00 00 00 09 | 00 | 01 | 00 00 00 00 | 01 00 01 01")
    assert c.response_top_level_tags(frame, 0, 10) == {0}
    assert c.response_top_level_tags(frame + b"\xff", 0, 10) == {0}
    with pytest.raises(DecodeError):
        c.response_top_level_tags(frame[:-1], 0, 10)


def test_an_api_versions_refusal_with_a_v0_body_and_bytes_after_it():
    """KIP-511: a v3 request refused with a v0 body. With a byte after that body it
    is still read as v0 (as the Java client falls back to v0 when the version asked
    for does not parse), the byte kept."""
    c = corpus_codec()
    # correlation id 5 | ErrorCode 35 | ApiKeys: int32 count 1, (18, 0, 3) | ff
    frame = h("00 00 00 05 | 00 23 | 00 00 00 01 | 00 12 00 00 00 03 | ff")
    resp = c.decode_response(frame, 18, 3)
    assert (resp.body_version, resp.body.ErrorCode, resp.trailing) == (0, 35, b"\xff")
    assert [(k.ApiKey, k.MinVersion, k.MaxVersion) for k in resp.body.ApiKeys] == [(18, 0, 3)]
    assert c.encode_response(resp) == frame
    with pytest.raises(DecodeError):
        c.decode_response(frame, 18, 3, strict=True)
    assert c.decode_response(frame[:-1], 18, 3).trailing == b""


def _flow(request: bytes) -> Flow:
    return Flow(1, 1, "127.0.0.1:1", "127.0.0.1:2", 3, 12, 3, "Metadata", request, 1)


def test_a_flow_with_bytes_after_a_message_is_flagged_not_undecoded():
    flows = [_flow(LIBRDKAFKA_METADATA), _flow(LIBRDKAFKA_METADATA[:-3])]
    for f in flows:
        decode_flow(codec(), f)
    assert flows[0].flags == {TRAILING} and flows[0].error is None
    assert flows[0].request_decoded.body.AllowAutoTopicCreation is False
    assert flows[1].flags == set()
    assert [parse("~trailing").matches(f) for f in flows] == [True, False]
    assert [parse("~undecoded").matches(f) for f in flows] == [False, False]


def test_a_rule_keeps_the_bytes_after_the_body():
    c = codec()
    rs = RuleSet([parse_flag("inject", "Metadata:request:top:tag=9:hex=ab")], c)
    new = rs.mutate_request(_flow(LIBRDKAFKA_METADATA), LIBRDKAFKA_METADATA)
    req = c.decode_request(new)
    assert req.body.unknown_tags == {9: b"\xab"} and req.trailing == h("01 00 00")
    # only the top-level tag section changed: 00 -> 01 09 01 ab
    assert new == LIBRDKAFKA_METADATA[:-4] + h("01 09 01 ab") + h("01 00 00")


@pytest.mark.asyncio
async def test_through_the_proxy_to_tansu(tansu):
    """The request reaches the broker byte for byte (the proxy changes nothing in
    it), is answered, the answer's broker address is rewritten as for any
    Metadata response, and the flow is flagged ``trailing-bytes``, not
    ``undecoded``."""
    ok = request_bytes(3, 12, 4, Topics=None)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        got = await exchange(*proxy.address, [LIBRDKAFKA_METADATA, ok])
        await proxy.pipeline.drained()
    flows = {f.correlation_id: f for f in rec.flows}
    odd, plain = flows[3], flows[4]
    assert odd.flags == {REWRITTEN, TRAILING}, (odd.flags, odd.error)
    assert UNDECODED not in plain.flags and TRAILING not in plain.flags
    assert odd.request == LIBRDKAFKA_METADATA and odd.request_sent is None
    c = codec()
    answer = c.decode_response(got[0], 3, 12)
    host, port = proxy.address
    assert [(b.Host, b.Port) for b in answer.body.Brokers] == [(host, port)]
    assert got[0] == odd.response_sent


def test_the_analysis_flags_them_and_counts_them_in_every_layout():
    """The analysis kernel (the Spark job's, and the single-process reference's):
    the flow is flagged as the proxy flags it, whatever the capture's lines say, and
    the what-if sizes count the bytes after the body in every layout, so that the
    fixed layout still gives the frame's size."""
    from kinspect.analysis.kernel import FlowAnalyzer
    from kinspect.codec.whatif import VarintSizer

    analyzer = FlowAnalyzer(codec().registry)
    pair = {"capture": "c", "conn": 1, "flow": 1, "api_key": 3, "api_version": 12,
            "correlation_id": 3, "req_frame": LIBRDKAFKA_METADATA, "req_flags": [],
            "resp_frame": None}
    row = analyzer.flow_row(pair)
    assert row["flags"] == [TRAILING] and row["decode_error"] is None
    assert row["request_decoded"]
    sizes, = analyzer.what_if_rows(pair, VarintSizer())
    assert sizes["bytes"] == sizes["fixed_bytes"] == len(LIBRDKAFKA_METADATA)
    # each layout of the same message without them is 3 bytes shorter
    clean, = analyzer.what_if_rows(dict(pair, req_frame=LIBRDKAFKA_METADATA[:-3]),
                                   VarintSizer())
    layouts = [k for k in sizes if k.endswith("_bytes")]
    assert len(layouts) >= 6
    assert all(sizes[k] - clean[k] == 3 for k in layouts), (sizes, clean)


def test_a_capture_s_stale_decode_flags_give_way_to_the_decoding_of_its_reader(tmp_path,
                                                                              capsys):
    """A capture written before these frames were decoded says ``undecoded`` (and a
    loaded proxy's says ``decode-skipped``): its reader decodes the flow itself, so
    those flags go when the decoding succeeds, and stay when it fails."""
    import base64
    import json

    from kinspect.capture import load_capture

    lines = [{"type": "session", "kinspect": "0.1.0", "start_ns": 1, "upstream": "u:1",
              "listen": "l:1", "specs": [], "part": 0}]
    for fid, frame, flags in ((1, LIBRDKAFKA_METADATA, ["undecoded"]),
                              (2, LIBRDKAFKA_METADATA[:-6], ["undecoded"]),
                              (3, LIBRDKAFKA_METADATA[:-3], ["decode-skipped"])):
        frame = frame[:4] + fid.to_bytes(4, "big") + frame[8:]  # correlation id fid
        lines.append({"type": "frame", "ts_ns": fid, "conn": 1, "dir": "req",
                      "client": "c:1", "upstream": "u:1", "flow": fid, "api_key": 3,
                      "api_version": 12, "correlation_id": fid, "flags": flags,
                      "frame": base64.b64encode(frame).decode()})
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    flows = {f.id: f for f in load_capture(path, codec()).flows}
    assert flows[1].flags == {TRAILING} and flows[1].error is None
    assert UNDECODED in flows[2].flags and "Metadata v12" in flows[2].error  # cut short
    assert flows[3].flags == set()
    # kinspect show decodes flow by flow (the capture loaded undecoded): the same
    from kinspect.cli import main

    assert main(["show", str(path), "--format", "json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert [rows[i]["flags"] for i in (1, 2, 3)] == [[TRAILING], [UNDECODED], []]


def test_replay_reports_bytes_after_the_body_that_changed():
    """Replay compares what the broker wrote: bytes after the body that appear,
    go or change are a difference, explained; the same ones are not."""
    from kinspect.replay import DIFFERING, MATCHED, FlowResult, Replayer

    c = codec()
    answer = c.encode_response(Response(3, 12, 3, 1, None, c.response_codec(3).cls(), 0, "",
                                        12))
    outcomes = []
    for recorded, replayed in ((b"", b""), (b"\x01", b"\x01"), (b"", b"\x01"),
                               (b"\x01", b""), (b"\x01", b"\x02")):
        flow = _flow(LIBRDKAFKA_METADATA)
        flow.response = answer + recorded
        decode_flow(c, flow)
        replayer = Replayer(c, [flow], ("127.0.0.1", 9), speed=None)
        res = FlowResult(flow)
        replayer._compare(res, answer + replayed)
        outcomes.append((res.status, [(d.path, d.recorded, d.replayed) for d in res.diffs]))
    assert outcomes[:2] == [(MATCHED, []), (MATCHED, [])]
    assert outcomes[2:] == [(DIFFERING, [("(bytes after the body)", None, "01")]),
                            (DIFFERING, [("(bytes after the body)", "01", None)]),
                            (DIFFERING, [("(bytes after the body)", "01", "02")])]
    assert "bytes after the body" in res.explanation and "01 recorded, 02 now" in res.explanation


def test_the_decode_command_keeps_them_warns_and_refuses_them_when_strict(tmp_path, capsys):
    import json

    from kinspect.cli import main

    path = tmp_path / "md.bin"
    path.write_bytes(LIBRDKAFKA_METADATA)
    out = tmp_path / "md.json"
    assert main(["decode", "--size-prefix", "no", "-o", str(out), str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: 3 bytes after the message, at offset 22" in err
    doc = json.loads(out.read_text())
    assert doc["trailing"] == "010000" and doc["body"]["AllowAutoTopicCreation"] is False
    back = tmp_path / "back.bin"
    assert main(["encode", "-o", str(back), str(out)]) == 0
    assert back.read_bytes() == LIBRDKAFKA_METADATA
    assert main(["decode", "--strict", "--size-prefix", "no", str(path)]) == 1
    assert "3 trailing bytes after the message" in capsys.readouterr().err
    for bad in (False, 0, [], {}, "zz"):
        (tmp_path / "bad.json").write_text(json.dumps(dict(doc, trailing=bad)))
        assert main(["encode", str(tmp_path / "bad.json")]) == 1
        assert "'trailing' must be a string of hex digits" in capsys.readouterr().err


def test_a_frame_without_a_header_keeps_its_undecoded_flag_when_shown(tmp_path, capsys):
    """decode_recorded leaves alone what it does not decode: a request too short for
    a header (api key -1) stays ``undecoded`` in ``kinspect show``."""
    import base64
    import json

    from kinspect.cli import main

    lines = [{"type": "session", "kinspect": "0.1.0", "start_ns": 1, "upstream": "u:1",
              "listen": "l:1", "specs": [], "part": 0},
             {"type": "frame", "ts_ns": 1, "conn": 1, "dir": "req", "client": "c:1",
              "upstream": "u:1", "flow": 1, "api_key": -1, "api_version": -1,
              "correlation_id": -1, "flags": ["no-response", "undecoded"],
              "frame": base64.b64encode(b"\x00\x03").decode()}]
    path = tmp_path / "garbage.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["show", str(path), "--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert UNDECODED in row["flags"], row
