"""Address rewriting by splicing (``AddressRewriter.splice``): only the addresses and
the sizes of the tagged fields around them change, whatever else the broker's bytes
hold. Checked against the codec's own re-encoding of the rewritten response, an
independent way to the same bytes when the broker's encoding is the codec's own, on
random responses of every API version that carries broker addresses (Apache Kafka's
spec corpus); and on responses encoded otherwise than the codec would (a boolean
byte 0x05, non-minimal varints, tags out of order), where re-encoding would change
more than the addresses."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codec_util import corpus_codec
from kinspect.codec import Codec
from kinspect.codec.errors import DecodeError
from kinspect.codec.protocol import Response
from kinspect.codec.values import struct_class
from kinspect.proxy.rewrite import AddressRewriter, _follow, endpoint_paths
from strategies import message_values

CODEC = corpus_codec()
REWRITER = AddressRewriter(CODEC.registry)


def _cases() -> list[tuple[int, int]]:
    out = []
    for api_key in sorted(CODEC.registry.api_keys()):
        spec = CODEC.registry.response(api_key)
        if spec is None or not endpoint_paths(spec):
            continue
        for v in range(spec.valid_versions.lowest, spec.valid_versions.highest + 1):
            if REWRITER.needs_rewrite(api_key, v):
                out.append((api_key, v))
    return out


CASES = _cases()


def test_the_cases_cover_every_kind_of_endpoint():
    """Metadata, FindCoordinator (top level and Coordinators), DescribeCluster, and
    the KIP-951 NodeEndpoints tagged fields of Produce and Fetch."""
    apis = {a for a, _ in CASES}
    assert {0, 1, 3, 10, 60} <= apis, apis
    assert (10, 0) in CASES and (10, 4) in CASES and (0, 10) in CASES and (1, 16) in CASES


def _frame(c: Codec, api_key: int, version: int, body) -> bytes:
    hv = c.response_header_version(api_key, version)
    return c.encode_response(Response(api_key, version, 7, hv, None, body, 0, "", version))


def _endpoint_structs(api_key: int, version: int, body) -> list:
    """The endpoint structs of ``body``, found as ``AddressRewriter.rewrite`` finds them."""
    return [st_ for path, _node in REWRITER.paths(api_key)
            if all(f.versions.contains(version) for f in path)
            for st_ in _follow(body, path)]


HOSTS = st.one_of(st.text(max_size=12), st.text(alphabet="ab.-", min_size=100, max_size=300))
ENDPOINTS = st.tuples(st.integers(-1, 5), HOSTS, st.integers(-1, 70000))


def _mapper(node, host, port):
    """Addresses of other lengths, some crossing a varint's 127 mark."""
    return ("p" * ((len(host) * 7 + (node or 0)) % 260) or "x"), 1 + (port * 31) % 65535


def _rewritten_by_reencoding(api_key: int, version: int, frame: bytes) -> bytes:
    return _reencoded(api_key, version, frame)[0]


def _reencoded(api_key: int, version: int, frame: bytes) -> tuple[bytes, int]:
    """The rewritten response re-encoded, and how many endpoints changed."""
    resp = CODEC.decode_response(frame, api_key, version)
    changed = REWRITER.rewrite(api_key, version, resp.body, _mapper)
    return CODEC.encode_response(resp), changed


def _splice(api_key: int, version: int, frame: bytes) -> tuple[bytes, int]:
    offset = CODEC.decode_response(frame, api_key, version, body=False).body_offset
    return REWRITER.splice(api_key, version, frame, offset, _mapper)


@pytest.mark.parametrize("api_key,version", CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_splicing_gives_the_bytes_of_re_encoding_on_canonical_responses(api_key, version,
                                                                         data):
    spec = CODEC.registry.response(api_key)
    body = data.draw(message_values(spec, version))
    structs = _endpoint_structs(api_key, version, body)
    nodes = {p for path, p in REWRITER.paths(api_key)
             if all(f.versions.contains(version) for f in path)}
    for s in structs:  # real-looking endpoints (the random ones mostly are not)
        node, host, port = data.draw(ENDPOINTS)
        s.Host, s.Port = host, port
        for name in nodes:
            if hasattr(s, name):
                setattr(s, name, node)
    frame = _frame(CODEC, api_key, version, body)
    expected, expected_changed = _reencoded(api_key, version, frame)
    got, changed = _splice(api_key, version, frame)
    assert got == expected
    assert changed == expected_changed
    if not changed:
        assert got is frame


def _cls(api_key: int, *path: str):
    st_ = CODEC.registry.response(api_key).struct
    for name in path:
        st_ = st_.field(name).struct
    return struct_class(st_)


def test_a_boolean_byte_other_than_one_stays_as_the_broker_sent_it():
    body = _cls(3).from_dict({
        "Brokers": [{"NodeId": 1, "Host": "broker-1", "Port": 9092}],
        "Topics": [{"ErrorCode": 0, "Name": "t", "IsInternal": True, "Partitions": []}]})
    canonical = _frame(CODEC, 3, 1, body)
    i = canonical.index(b"\x00\x01t") + 3  # IsInternal follows the name "t"
    assert canonical[i] == 1
    odd = canonical[:i] + b"\x05" + canonical[i + 1:]
    expected = _rewritten_by_reencoding(3, 1, canonical)
    j = expected.index(b"\x00\x01t") + 3
    assert expected[j] == 1
    got, changed = _splice(3, 1, odd)
    assert changed == 1 and got == expected[:j] + b"\x05" + expected[j + 1:]
    assert _rewritten_by_reencoding(3, 1, odd) == expected  # re-encoding loses the 0x05


def _widen(buf: bytes, at: int) -> bytes:
    """The one-byte varint at ``at`` written in two bytes (Kafka's readers take it)."""
    b = buf[at]
    assert b < 0x80
    return buf[:at] + bytes([b | 0x80, 0]) + buf[at + 1:]


def test_a_non_minimal_length_prefix_keeps_its_width():
    body = _cls(3).from_dict({"Brokers": [{"NodeId": 1, "Host": "broker-1", "Port": 9092}]})
    canonical = _frame(CODEC, 3, 12, body)
    at = canonical.index(b"broker-1") - 1  # the host's compact length (9)
    odd = _widen(canonical, at)
    assert CODEC.decode_response(odd, 3, 12).body.Brokers[0].Host == "broker-1"
    expected = _rewritten_by_reencoding(3, 12, canonical)
    new_host = _mapper(1, "broker-1", 9092)[0].encode()
    assert len(new_host) + 1 < 0x80
    at2 = expected.index(new_host) - 1
    got, changed = _splice(3, 12, odd)
    assert changed == 1 and got == _widen(expected, at2)


def _produce_v10(endpoints, unknown=None) -> bytes:
    ep = _cls(0, "NodeEndpoints")
    body = _cls(0)(NodeEndpoints=[ep(NodeId=n, Host=h, Port=p) for n, h, p in endpoints]
                   if endpoints is not None else [],
                   unknown_tags=unknown or {})
    return _frame(CODEC, 0, 10, body)


def test_the_size_of_the_tagged_field_around_the_addresses_follows_them():
    """KIP-951 NodeEndpoints is a top-level tagged field: its size grows with the
    host, past 127 bytes into a second varint byte; a non-minimal size keeps its
    width."""
    eps = [(1, "a", 9092), (2, "b", 9093)]
    canonical = _produce_v10(eps)
    got, changed = _splice(0, 10, canonical)
    expected = _rewritten_by_reencoding(0, 10, canonical)
    assert changed == 2 and got == expected
    resp = CODEC.decode_response(got, 0, 10)
    assert [(e.Host, e.Port) for e in resp.body.NodeEndpoints] == \
        [_mapper(n, h, p) for n, h, p in eps]
    # the size varint, widened: the tag section is [count 1][tag 0][size]...
    before = _produce_v10(None)
    size_at = len(before) - 1 + 2  # (the empty section's count is its last byte)
    assert canonical[len(before) - 1] == 1 and canonical[len(before)] == 0
    size = canonical[size_at]
    assert size < 0x80
    odd = _widen(canonical, size_at)
    new_size = len(expected) - len(before) - 2 - (1 if expected[size_at] >= 0x80 else 0)
    got_odd, _ = _splice(0, 10, odd)
    assert CODEC.decode_response(got_odd, 0, 10).body.NodeEndpoints == resp.body.NodeEndpoints
    assert got_odd[size_at:size_at + 2] == bytes([(new_size & 0x7F) | 0x80, new_size >> 7])
    assert got_odd[size_at + 2:] == expected[size_at + (2 if expected[size_at] >= 0x80 else 1):]


def test_tags_out_of_order_stay_in_the_broker_s_order():
    """An unknown tag 5 before NodeEndpoints (tag 0): re-encoding sorts them, splicing
    leaves them as they came."""
    eps = [(1, "broker-1", 9092)]
    only_eps = _produce_v10(eps)
    only_5 = _produce_v10(None, {5: b"xyz"})
    empty = _produce_v10(None)
    head = empty[:-1]  # everything before the top-level tag section's count
    tag0, tag5 = only_eps[len(empty):], only_5[len(empty):]
    odd = head + b"\x02" + tag5 + tag0
    sorted_ = _frame(CODEC, 0, 10, CODEC.decode_response(odd, 0, 10).body)
    assert sorted_ == head + b"\x02" + tag0 + tag5 != odd
    new_tag0 = _rewritten_by_reencoding(0, 10, only_eps)[len(empty):]
    got, changed = _splice(0, 10, odd)
    assert changed == 1 and got == head + b"\x02" + tag5 + new_tag0


def test_placeholders_and_unchanged_addresses_leave_the_frame_alone():
    placeholder = _cls(10)(ErrorCode=15, NodeId=-1, Host="", Port=-1)
    frame = _frame(CODEC, 10, 2, placeholder)
    got, changed = _splice(10, 2, frame)
    assert changed == 0 and got is frame
    same = _frame(CODEC, 10, 2, _cls(10)(NodeId=1, Host="h", Port=1))
    offset = CODEC.decode_response(same, 10, 2, body=False).body_offset
    assert REWRITER.splice(10, 2, same, offset, lambda n, h, p: (h, p)) == (same, 0)


def test_a_body_cut_short_is_a_decode_error():
    frame = _frame(CODEC, 10, 2, _cls(10)(NodeId=1, Host="h", Port=1))
    offset = CODEC.decode_response(frame, 10, 2, body=False).body_offset
    with pytest.raises(DecodeError):
        REWRITER.splice(10, 2, frame[:-1], offset, _mapper)


def test_bytes_after_the_body_stay_after_it():
    """Kafka's parsers do not read past a message, so a client acts on the
    addresses of a response with bytes after its body: they are rewritten, and the
    bytes after stay as they were (as ``Codec.encode_response`` writes them)."""
    frame = _frame(CODEC, 10, 2, _cls(10)(NodeId=1, Host="h", Port=1))
    offset = CODEC.decode_response(frame, 10, 2, body=False).body_offset
    new, changed = REWRITER.splice(10, 2, frame + b"\x07\x00", offset, _mapper)
    resp = CODEC.decode_response(new, 10, 2)
    assert changed == 1 and resp.trailing == b"\x07\x00"
    assert (resp.body.Host, resp.body.Port) == _mapper(1, "h", 1)
    resp.trailing = b""
    assert new == CODEC.encode_response(resp) + b"\x07\x00"


def test_ports_in_varint_encodings_are_spliced_in_their_encoding():
    """The proposed per-field ``encoding`` (packed: zig-zag varint; upacked: unsigned
    varint) on an endpoint's Port and NodeId: read and written as such, a varint
    keeping its width where the new value fits."""
    import json

    from kinspect.codec import SpecRegistry

    for enc in ("packed32", "upacked32"):
        reg = SpecRegistry()
        spec = reg.add_text(json.dumps({
            "apiKey": 10, "type": "response", "name": "FindCoordinatorResponse",
            "validVersions": "0", "flexibleVersions": "0+", "fields": [
                {"name": "NodeId", "type": "int32", "versions": "0+",
                 "entityType": "brokerId", "encoding": enc},
                {"name": "Host", "type": "string", "versions": "0+"},
                {"name": "Port", "type": "int32", "versions": "0+", "encoding": enc}]}),
            "inline.json")
        mc = reg.codec(spec)
        rw = AddressRewriter(reg)
        body = mc.cls(NodeId=3, Host="h", Port=9092)
        raw = mc.encode(body, 0)
        got, changed = rw.splice(10, 0, raw, 0, lambda n, h, p: ("proxy", 40000 + n))
        assert changed == 1
        back = mc.decode(got, 0)
        assert (back.NodeId, back.Host, back.Port) == (3, "proxy", 40003)
        body.Host, body.Port = "proxy", 40003
        assert got == mc.encode(body, 0)
        assert struct.pack(">i", 40003) not in got  # not written fixed-width


def test_a_host_that_is_not_utf8_is_read_as_the_decoder_reads_it():
    """The codec reads strings with ``surrogateescape`` (lossless): a host that is
    not UTF-8 is mapped under the same name a decode gives it."""
    frame = _frame(CODEC, 10, 2, _cls(10)(NodeId=1, Host="hh", Port=1))
    i = frame.index(b"hh")
    bad = frame[:i] + b"\xff" + frame[i + 1:]
    seen = []

    def mapper(node, host, port):
        seen.append(host)
        return _mapper(node, host, port)

    offset = CODEC.decode_response(bad, 10, 2, body=False).body_offset
    got, changed = REWRITER.splice(10, 2, bad, offset, mapper)
    assert changed == 1 and seen == [CODEC.decode_response(bad, 10, 2).body.Host]
    assert got == _rewritten_by_reencoding(10, 2, bad)


@pytest.mark.parametrize("api_key,version", [(3, 12), (3, 1), (10, 4), (0, 10), (1, 16)])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_responses_are_decode_errors_or_walk_to_their_end(api_key, version, data):
    """Any bytes at all: the splice either walks them to their end or raises a
    DecodeError (no other exception, nothing allocated beyond the input's size)."""
    spec = CODEC.registry.response(api_key)
    frame = _frame(CODEC, api_key, version, data.draw(message_values(spec, version)))
    offset = CODEC.decode_response(frame, api_key, version, body=False).body_offset
    body = bytearray(frame[offset:])
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = data.draw(st.integers(0, max(0, len(body) - 1)))
        if op == "flip" and body:
            body[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and body:
            del body[at]
        elif op == "cut":
            del body[at:]
    damaged = frame[:offset] + bytes(body)
    try:
        got, changed = REWRITER.splice(api_key, version, damaged, offset, _mapper)
    except DecodeError:
        return
    assert changed >= 0 and len(got) <= len(damaged) + changed * 600


# -- endpoint structs no Kafka spec has, as a spec of one's own may ---------------

def _inline(fields: list, version: str = "0") -> tuple:
    """(registry, message codec, rewriter) of an inline Metadata-like response."""
    import json

    from kinspect.codec import SpecRegistry

    reg = SpecRegistry()
    spec = reg.add_text(json.dumps({
        "apiKey": 3, "type": "response", "name": "MetadataResponse",
        "validVersions": version, "flexibleVersions": "0+", "fields": fields}), "inline.json")
    return reg, reg.codec(spec), AddressRewriter(reg)


def _both(mc, rw, body, version: int = 0):
    """(spliced, re-encoded) with the mapper calls of each, for one inline body."""
    raw = mc.encode(body, version)
    calls: list[list] = [[], []]

    def mapper_of(k):
        def mapper(node, host, port):
            calls[k].append((node, host, port))
            return _mapper(node, host, port)
        return mapper

    got, n = rw.splice(3, version, raw, 0, mapper_of(0))
    dec = mc.decode(raw, version)
    m = rw.rewrite(3, version, dec, mapper_of(1))
    assert n == m
    return got, mc.encode(dec, version), calls


def _ep(*extra, node_versions="0+", node_tagged=False):
    node = {"name": "NodeId", "type": "int32", "versions": node_versions,
            "entityType": "brokerId"}
    if node_tagged:
        node.update(taggedVersions="0+", tag=0, default="7")
    return [node, {"name": "Host", "type": "string", "versions": "0+"}, *extra,
            {"name": "Port", "type": "int32", "versions": "0+"}]


def test_an_endpoint_inside_another_between_its_fields():
    """Brokers[]{NodeId, Host, Alternates[]{NodeId, Host, Port}, Port}: both rewritten,
    the outer one's Port with its own Host (each struct has its own group)."""
    reg, mc, rw = _inline([{"name": "Brokers", "type": "[]Broker", "versions": "0+",
                            "fields": _ep({"name": "Alternates", "type": "[]Alt",
                                           "versions": "0+", "fields": _ep()})}])
    body = mc.cls.from_dict({"Brokers": [
        {"NodeId": 1, "Host": "b1", "Port": 9092,
         "Alternates": [{"NodeId": 2, "Host": "alt", "Port": 9093}]}]})
    got, expected, (spliced, rewritten) = _both(mc, rw, body)
    assert got == expected and len(spliced) == 2
    assert sorted(spliced) == sorted(rewritten)


@pytest.mark.parametrize("kind", ["later versions", "tagged, left out"])
def test_a_broker_id_not_on_the_wire_is_its_default(kind):
    """A broker id of later versions only, or a tagged one left out of the tag
    section: the mapper gets its default, as a decoded body has it."""
    if kind == "later versions":
        fields = _ep(node_versions="1+")
    else:
        fields = _ep(node_tagged=True)
    reg, mc, rw = _inline([{"name": "Brokers", "type": "[]Broker", "versions": "0+",
                            "fields": fields}], version="0-1")
    body = mc.cls.from_dict({"Brokers": [{"Host": "b1", "Port": 9092}]})
    got, expected, (spliced, rewritten) = _both(mc, rw, body)
    assert got == expected and spliced == rewritten
    assert spliced[0][0] == (0 if kind == "later versions" else 7)


def test_a_tagged_endpoint_in_every_element_splices_in_one_sweep():
    """Brokers[]{Ep: tagged {NodeId, Host, Port}}: a size to fix in every element
    (found each from the edits in one pass, not by summing all edits per size)."""
    reg, mc, rw = _inline([{"name": "Brokers", "type": "[]Broker", "versions": "0+",
                            "fields": [{"name": "Ep", "type": "Ep", "versions": "0+",
                                        "taggedVersions": "0+", "tag": 3,
                                        "fields": _ep()}]}])
    ep = struct_class(mc.spec.struct.field("Brokers").struct.field("Ep").struct)
    broker = struct_class(mc.spec.struct.field("Brokers").struct)
    body = mc.cls(Brokers=[broker(Ep=ep(NodeId=i % 5, Host="h" * (i % 140), Port=9000 + i))
                           for i in range(600)])
    got, expected, _ = _both(mc, rw, body)
    assert got == expected


async def test_a_tagged_host_or_port_is_rewritten_by_re_encoding():
    """A Port that is a tagged field (left out when 0) cannot be spliced in without
    adding to a tag section: ``splice`` says so (Unspliceable) and the proxy
    decodes, rewrites and re-encodes that response instead."""
    from kinspect.proxy.rewrite import Unspliceable
    from kinspect.proxy.server import Proxy, ProxyConfig

    fields = [{"name": "NodeId", "type": "int32", "versions": "0+", "entityType": "brokerId"},
              {"name": "Host", "type": "string", "versions": "0+"},
              {"name": "Port", "type": "int32", "versions": "0+", "taggedVersions": "0+",
               "tag": 1, "default": "0"}]
    reg, mc, rw = _inline([{"name": "Brokers", "type": "[]Broker", "versions": "0+",
                            "fields": fields}])
    body = mc.cls.from_dict({"Brokers": [{"NodeId": 1, "Host": "127.0.0.1", "Port": 9092}]})
    with pytest.raises(Unspliceable, match="Port is tagged"):
        rw.splice(3, 0, mc.encode(body, 0), 0, _mapper)
    for name in ("RequestHeader", "ResponseHeader"):
        reg.add(CODEC.registry.messages[name])
    c = Codec(reg)
    hv = c.response_header_version(3, 0)
    frame = c.encode_response(Response(3, 0, 7, hv, None, body, 0, "", 0))
    proxy = Proxy(ProxyConfig(upstream=("127.0.0.1", 9)), c)
    await proxy.start()
    try:
        new = proxy.rewrite_response(3, 0, frame)
        [b] = c.decode_response(new, 3, 0).body.Brokers
        listener = proxy.listeners[("127.0.0.1", 9092)]  # that broker's own listener
        assert (b.Host, b.Port) == (proxy.advertised_host(), listener.port)
    finally:
        await proxy.close()


def test_a_mapped_host_that_is_not_utf8_is_written_as_the_codec_writes_it():
    reg, mc, rw = _inline([{"name": "Brokers", "type": "[]Broker", "versions": "0+",
                            "fields": _ep()}])
    raw = mc.encode(mc.cls.from_dict({"Brokers": [{"NodeId": 1, "Host": "b", "Port": 1}]}), 0)
    got, n = rw.splice(3, 0, raw, 0, lambda n, h, p: ("\udcffx", 2))
    assert n == 1 and mc.decode(got, 0).Brokers[0].Host == "\udcffx"
    assert b"\xffx" in got
