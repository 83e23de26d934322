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
