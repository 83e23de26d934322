"""FlowTracker (sans-io pairing): correlation ids, acks=0, SASL v0 raw tokens.

Frames are built with the codec; no network is involved because the tracker
never touches one.
"""

from __future__ import annotations

import itertools
import struct

from proxyutil import codec, request_bytes

from kinspect.codec.protocol import Response
from kinspect.flows import CLOSED, NO_RESPONSE, SASL_TOKEN, UNDECODED, UNPAIRED
from kinspect.proxy.tracker import FlowTracker


def tracker() -> FlowTracker:
    ids = itertools.count(1)
    return FlowTracker(codec(), 1, "127.0.0.1:1", "127.0.0.1:2", lambda: next(ids))


def response_bytes(api_key: int, api_version: int, correlation_id: int, **body) -> bytes:
    c = codec()
    cls = c.response_codec(api_key).cls
    hv = c.response_header_version(api_key, api_version)
    return c.encode_response(Response(api_key, api_version, correlation_id, hv, None, cls(**body),
                                      0, "", api_version))


def test_responses_pair_by_correlation_id_out_of_order():
    t = tracker()
    a = t.request(request_bytes(3, 12, 10, Topics=None), 1)
    b = t.request(request_bytes(18, 3, 11, ClientSoftwareName="x", ClientSoftwareVersion="1"), 2)
    got_b = t.response(response_bytes(18, 3, 11), 3)
    got_a = t.response(response_bytes(3, 12, 10), 4)
    assert got_a is a and got_b is b
    assert a.response_ns == 4 and b.api_name == "ApiVersions"
    assert not t.pending and not t.inflight


def test_unmatched_response_is_flagged_unpaired():
    t = tracker()
    flow = t.response(response_bytes(3, 12, 99), 1)
    assert UNPAIRED in flow.flags and flow.correlation_id == 99


def test_short_request_frame_is_flagged_not_dropped():
    flow = tracker().request(b"\x00\x03", 1)
    assert {UNDECODED, NO_RESPONSE} <= flow.flags and flow.request == b"\x00\x03"


def test_show_says_why_a_short_request_has_no_response_and_an_acks0_produce_none():
    """A request too short for a header has no correlation id to pair an answer by:
    ``show --flow`` says so, not "no response expected (acks=0)", which it said of
    a garbage frame; an acks=0 Produce keeps that wording."""
    from rich.console import Console

    from kinspect.show import flow_tree

    def drawn(flow) -> str:
        console = Console(width=200, record=True, file=__import__("io").StringIO())
        console.print(flow_tree(flow, codec()))
        return console.export_text()

    t = tracker()
    short = drawn(t.request(b"", 1))
    assert "none can be paired with it: it has no request header" in short
    assert "acks=0" not in short
    topic = codec().request_codec(0).spec.struct.field("TopicData").struct.cls
    acks0 = t.request(request_bytes(0, 9, 5, Acks=0, TransactionalId=None, TimeoutMs=10,
                                    TopicData=[topic(Name="t", PartitionData=[])]), 2)
    assert "no response expected (acks=0)" in drawn(acks0)


def test_acks_zero_produce_is_not_awaited():
    c = codec()
    t = tracker()
    topic = c.request_codec(0).spec.struct.field("TopicData").struct.cls
    for version, acks in ((9, 0), (3, 0), (9, -1)):
        flow = t.request(request_bytes(0, version, version + acks, Acks=acks,
                                       TransactionalId=None, TimeoutMs=10,
                                       TopicData=[topic(Name="t", PartitionData=[])]), 1)
        assert (NO_RESPONSE in flow.flags) == (acks == 0)
    assert list(t.pending) == [8]


def test_sasl_handshake_v0_switches_to_raw_tokens_until_a_request_header():
    t = tracker()
    hs = t.request(request_bytes(17, 0, 1, Mechanism="PLAIN"), 1)
    hs_answer = response_bytes(17, 0, 1, ErrorCode=0, Mechanisms=["PLAIN"])
    assert t.response(hs_answer, 2) is hs
    assert t.sasl_raw
    token = b"\x00user\x00secret"
    tok = t.request(token, 3)
    assert SASL_TOKEN in tok.flags and tok.api_name == "SaslToken"
    answer = t.response(b"", 4)  # PLAIN's server answer is an empty token
    assert answer is tok and tok.response == b""
    after = t.request(request_bytes(3, 12, 2, Topics=None), 5)
    assert not t.sasl_raw and after.api_name == "Metadata"
    assert t.response(response_bytes(3, 12, 2), 6) is after
    assert hs.response == hs_answer


def test_short_raw_sasl_tokens_are_tokens_not_malformed_requests():
    """A PLAIN token shorter than a request header (or an empty SCRAM/GSSAPI token)
    is still a token: paired with the next answer, and flagged so captures redact it."""
    t = tracker()
    t.request(request_bytes(17, 0, 1, Mechanism="PLAIN"), 1)
    t.response(response_bytes(17, 0, 1, ErrorCode=0, Mechanisms=["PLAIN"]), 2)
    for i, token in enumerate((b"\x00a\x00pw12", b"")):
        tok = t.request(token, 3 + i)
        assert SASL_TOKEN in tok.flags and UNDECODED not in tok.flags
        assert t.response(b"", 10 + i) is tok


def test_failed_sasl_handshake_stays_in_kafka_framing():
    t = tracker()
    t.request(request_bytes(17, 0, 1, Mechanism="NOPE"), 1)
    t.response(response_bytes(17, 0, 1, ErrorCode=33, Mechanisms=["PLAIN"]), 2)
    assert not t.sasl_raw


def test_close_returns_waiting_flows_flagged_closed():
    t = tracker()
    f = t.request(request_bytes(3, 12, 5, Topics=None), 1)
    assert t.close() == [f] and CLOSED in f.flags and not t.pending


def test_frame_header_fields_come_from_the_frame():
    frame = request_bytes(3, 12, 0x01020304, Topics=None)
    assert struct.unpack_from(">hhi", frame) == (3, 12, 0x01020304)
    flow = tracker().request(frame, 1)
    assert (flow.api_key, flow.api_version, flow.correlation_id) == (3, 12, 0x01020304)


def test_api_versions_error_35_decodes_as_v0_even_beyond_the_specs():
    """GUIDE §2.5: a broker refuses an unknown ApiVersions version with a v0 body and
    error 35, also when the client asked for a version the loaded specs lack."""
    c = codec()
    body = response_bytes(18, 0, 7, ErrorCode=35)
    top = c.registry.response(18).valid_versions.highest
    for asked in (3, top, top + 1, 99):
        resp = c.decode_response(body, 18, asked)
        assert resp.body.ErrorCode == 35 and resp.body_version == 0 and resp.header_version == 0
        assert resp.correlation_id == 7


def test_a_reused_correlation_id_pairs_its_answers_in_request_order():
    """A client may send a request with the id of one still waiting for its answer.
    Answers come in request order: the first answer of the id pairs with the first
    request, the next with the next, and nothing is left waiting (a flow left
    behind would be reported ``closed`` and keep a shutdown waiting for it)."""
    t = tracker()
    meta = t.request(request_bytes(3, 12, 5, Topics=None), 1)
    av = t.request(request_bytes(18, 3, 5, ClientSoftwareName="x", ClientSoftwareVersion="1"), 2)
    third = t.request(request_bytes(3, 12, 5, Topics=None), 3)
    assert t.peek(5) is meta
    assert t.response(response_bytes(3, 12, 5), 4) is meta
    assert t.peek(5) is av
    assert t.response(response_bytes(18, 3, 5), 5) is av
    assert t.response(response_bytes(3, 12, 5), 6) is third
    assert not t.pending and not t.inflight and not t.dups
    assert UNPAIRED in t.response(response_bytes(3, 12, 5), 7).flags


def test_a_header_naming_a_negative_api_key_is_undecoded_and_keeps_its_id():
    """An int16 api key below 0 is no Kafka api (theirs are 0 and up): the request is
    flagged undecoded with why, as an unknown positive key is, and its correlation
    id is a real one (shown, paired); a header too short to have one still has none.
    (Its flow was left unflagged, its id shown as -, and its answer redacted in a
    capture as that of no known request.)"""
    from kinspect.capture import redact_frame
    from kinspect.flows import has_correlation_id

    t = tracker()
    body = struct.pack(">hhih", -5, 0, 7, 3) + b"raw" + b"payload"
    flow = t.request(body, 1)
    assert UNDECODED in flow.flags and "api key -5" in flow.error
    assert flow.correlation_id == 7 and has_correlation_id(flow)
    answer = struct.pack(">i", 7) + b"OK"
    assert t.response(answer, 2) is flow and UNPAIRED not in flow.flags
    assert redact_frame(codec(), answer, "resp", flow.api_key, flow.api_version) is None
    unknown = redact_frame(codec(), answer, "resp", -1, -1)  # (an answer to no request)
    assert unknown is not None and unknown[:4] == answer[:4] and unknown[4:] != b"OK"
    short = t.request(b"\x00\x03", 3)
    assert not has_correlation_id(short)
