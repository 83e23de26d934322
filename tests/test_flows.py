"""Flow helpers: the error code shown for a response."""

from __future__ import annotations

import pytest
from codec_util import corpus_registry
from hypothesis import HealthCheck, given, settings
from strategies import message_values

from kinspect.flows import top_level_error_code

REG = corpus_registry()


def _reference(body):
    """The rule, walked generically over values: the top-level ErrorCode, else the
    first non-zero one in breadth-first order down to three levels of arrays of
    structs, else 0 when such fields exist, else None."""
    if body is None:
        return None
    if "ErrorCode" in body.keys():
        return body.ErrorCode
    found, level = None, [body]
    for _ in range(3):
        nxt = []
        for s in level:
            for name in s.keys():
                v = getattr(s, name)
                if isinstance(v, list):
                    for x in v:
                        if hasattr(x, "_fields"):
                            if "ErrorCode" in x.keys():
                                if x.ErrorCode:
                                    return x.ErrorCode
                                found = 0
                            nxt.append(x)
        level = nxt
    return found


RESPONSES = sorted(n for n, s in REG.messages.items() if s.type == "response")


@pytest.mark.parametrize("name", RESPONSES)
@pytest.mark.parametrize("which", ["lowest", "highest"])
def test_error_code_of_every_response_follows_the_rule(name, which):
    spec = REG.messages[name]

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(message_values(spec, getattr(spec.valid_versions, which)))
    def check(body):
        assert top_level_error_code(body) == _reference(body)

    check()


def test_error_code_examples():
    produce = REG.codec("ProduceResponse")
    T = produce.spec.struct.field("Responses").struct
    P = T.field("PartitionResponses").struct
    body = produce.cls(Responses=[T.cls(Name="a", PartitionResponses=[P.cls(ErrorCode=0)]),
                                  T.cls(Name="b", PartitionResponses=[P.cls(ErrorCode=0),
                                                                      P.cls(ErrorCode=6)])])
    assert top_level_error_code(body) == 6
    body.Responses[1].PartitionResponses[1].ErrorCode = 0
    assert top_level_error_code(body) == 0
    body.Responses = []
    assert top_level_error_code(body) is None
    assert top_level_error_code(REG.codec("ApiVersionsResponse").cls(ErrorCode=35)) == 35
    assert top_level_error_code(None) is None


def test_error_code_at_a_version_leaves_out_fields_absent_at_it():
    from kinspect.codec import Codec

    md = Codec().response_codec(3)  # the shipped specs: Metadata's top-level ErrorCode
    assert str(md.spec.struct.field("ErrorCode").versions) == "13+"
    T = md.spec.struct.field("Topics").struct
    body = md.cls(Topics=[T.cls(Name="t", ErrorCode=3)])
    assert top_level_error_code(body) == 0  # every field of the spec
    assert top_level_error_code(body, 12) == 3
    assert top_level_error_code(body, 13) == 0
    assert top_level_error_code(md.cls(), 12) is None  # no topics: no code at all
    assert top_level_error_code(md.cls(), 13) == 0


def _metadata_v12_pair_with_a_topic_error(code: int) -> tuple[bytes, bytes]:
    """A Metadata v12 request and its answer (frames without the size prefix) where
    topic ``t`` has error ``code``; v12 has no top-level ``ErrorCode`` (13+)."""
    import struct

    from kinspect.codec import Codec

    c = Codec()
    md_req, md_resp = c.request_codec(3), c.response_codec(3)
    req_body = md_req.encode(md_req.cls(Topics=None), 12)
    T = md_resp.spec.struct.field("Topics").struct
    resp_body = md_resp.encode(md_resp.cls(Topics=[T.cls(Name="t", ErrorCode=code)]), 12)
    # request header v2 (client id "c", empty tag section), response header v1
    req = struct.pack(">hhih", 3, 12, 7, 1) + b"c" + b"\x00" + req_body
    resp = struct.pack(">i", 7) + b"\x00" + resp_body
    return req, resp


def test_replay_and_analysis_read_error_codes_at_the_answer_version():
    from kinspect.analysis.kernel import FlowAnalyzer
    from kinspect.codec import Codec, default_registry
    from kinspect.replay import _top_error

    req, resp = _metadata_v12_pair_with_a_topic_error(3)
    decoded = Codec().decode_response(resp, 3, 12)
    assert decoded.body_version == 12
    assert _top_error(decoded) == 3
    row = FlowAnalyzer(default_registry()).flow_row(
        {"capture": "c.jsonl", "conn": 1, "correlation_id": 7, "seq": 0, "flow": 1,
         "client": "127.0.0.1:1", "upstream": "127.0.0.1:2", "api_key": 3,
         "api_version": 12, "req_frame": req, "resp_frame": resp, "req_ns": 1,
         "resp_ns": 2, "req_flags": [], "resp_flags": [], "resp_sent_bytes": None})
    assert row["error_code"] == 3


def test_a_flow_decoded_again_keeps_one_copy_of_its_errors():
    """A flow whose decoded values were let go (``kinspect show`` does, flow by flow)
    can be decoded again: its ``undecoded`` flag and error text stay as they were,
    not doubled; a copy has flags of its own."""
    from pathlib import Path

    from kinspect.capture import load_capture
    from kinspect.codec import Codec
    from kinspect.proxy.pipeline import decode_flow

    codec = Codec()
    example = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
    flow = load_capture(example, codec, decode=False).flows[1]
    flow.response = flow.response[:-3]
    decode_flow(codec, flow)
    first = flow.error
    assert "undecoded" in flow.flags and first.startswith("response: ")
    for _ in range(2):
        flow.request_decoded = flow.response_decoded = None
        decode_flow(codec, flow)
        assert flow.error == first and flow.request_decoded is not None
    copy = flow.copy()
    copy.flags.add("x")
    assert "x" not in flow.flags and copy.error == first and copy.id == flow.id
