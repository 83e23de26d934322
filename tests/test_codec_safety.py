"""Safety: malformed bytes raise DecodeError carrying api, version, field path and
byte offset; never IndexError, struct.error, MemoryError or a hang (GUIDE 2.13,
KAFKA-14063)."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from codec_util import corpus_codec, corpus_registry, h, inline

from kinspect.codec import DecodeError


def _metadata_response():
    reg = corpus_registry()
    mc = reg.codec("MetadataResponse")
    top = mc.spec.struct
    T = top.field("Topics").struct
    P = T.field("Partitions").struct
    B = top.field("Brokers").struct
    value = mc.cls(
        Brokers=[B.cls(NodeId=1, Host="b1", Port=9092, Rack=None)], ClusterId="c",
        Topics=[T.cls(Name=f"t{i}", TopicId=bytes([i]) * 16, Partitions=[
            P.cls(PartitionIndex=p, LeaderId=1, ReplicaNodes=[1, 2], IsrNodes=[1])
            for p in range(2)]) for i in range(2)])
    return mc, value


@pytest.mark.parametrize("version", [1, 9, 12])
def test_every_truncation_is_a_decode_error_with_context(version):
    mc, value = _metadata_response()
    raw = mc.encode(value, version)
    assert mc.encode(mc.decode(raw, version), version) == raw
    for cut in range(len(raw)):
        with pytest.raises(DecodeError) as ei:
            mc.decode(raw[:cut], version)
        e = ei.value
        assert e.api == "MetadataResponse" and e.version == version
        assert e.offset is not None and 0 <= e.offset <= cut, (cut, e)
        assert e.path, (cut, e)


def test_truncation_inside_a_nested_field_names_its_path_and_offset():
    mc, value = _metadata_response()
    raw = mc.encode(value, 1)
    # v1 layout: Brokers (4 + 4+2+2+4+2 = 18), ControllerId 4, Topics count 4, then
    # Topic[0]: ErrorCode 2, Name 2+2, IsInternal 1, Partitions count 4,
    # Partition[0]: ErrorCode 2, PartitionIndex 4 ...
    p0 = 18 + 4 + 4 + 2 + 4 + 1 + 4
    with pytest.raises(DecodeError) as ei:
        mc.decode(raw[:p0 + 3], 1)
    e = ei.value
    assert e.path == "Topics[0].Partitions[0].PartitionIndex"
    assert e.offset == p0 + 2 and e.expected == "int32"
    assert "truncated" in e.reason
    assert "MetadataResponse v1" in str(e) and "offset" in str(e)


# ApiVersions v3 request, laid out by hand from ApiVersionsRequest.json and the
# protocol guide: request header v2 is api_key int16 (00 12) + api_version int16
# (00 03) + correlation_id int32 + client_id int16-length string ("t": 00 01 74) +
# an empty tagged-field section (00): 2 + 2 + 4 + 3 + 1 = 12 bytes. The body starts
# with ClientSoftwareName, a compact string: an unsigned varint (length + 1) first.
_API_VERSIONS_V3_HEADER = bytes.fromhex("0012" "0003" "00000007" "0001" "74" "00")


@pytest.mark.parametrize("cut_varint", ["80", "8080", "808080", "80808080", "ffffffff"])
def test_a_cut_varint_is_reported_where_it_starts(cut_varint):
    """A varint cut after any number of continuation bytes (the high bit set: more
    follow) fails at the offset where the varint starts, not where the bytes end,
    for the short and the long (3 or more bytes) varint readers alike."""
    frame = _API_VERSIONS_V3_HEADER + bytes.fromhex(cut_varint)
    assert len(_API_VERSIONS_V3_HEADER) == 12
    with pytest.raises(DecodeError) as ei:
        corpus_codec().decode_request(frame)
    e = ei.value
    assert (e.offset, e.expected, e.path) == (12, "varint", "ClientSoftwareName"), e
    # the same cut in the second field: ClientSoftwareName "a" is 02 61 (length 1
    # as 1 + 1), so ClientSoftwareVersion's varint starts at 12 + 2 = 14
    with pytest.raises(DecodeError) as ei:
        corpus_codec().decode_request(_API_VERSIONS_V3_HEADER + b"\x02a" +
                                      bytes.fromhex(cut_varint))
    e = ei.value
    assert (e.offset, e.expected, e.path) == (14, "varint", "ClientSoftwareVersion"), e


def test_trailing_bytes():
    mc, value = _metadata_response()
    raw = mc.encode(value, 12)
    with pytest.raises(DecodeError) as ei:
        mc.decode(raw + b"\x00", 12)
    assert ei.value.offset == len(raw) and "trailing" in ei.value.reason


def _one_field(ftype, flexible=False, nullable=False):
    elems = {"fields": [{"name": "V", "type": "int8", "versions": "0+"}]} \
        if ftype == "[]S" else {}
    return inline({"name": "X", "type": "data", "validVersions": "0",
                   "flexibleVersions": "0+" if flexible else "none",
                   "fields": [{"name": "F", "type": ftype, "versions": "0+", **elems,
                               **({"nullableVersions": "0+"} if nullable else {})},
                              {"name": "G", "type": "int8", "versions": "0+"}]})


@pytest.mark.parametrize("ftype,flexible,wire,why", [
    ("string", False, "7f ff 61 62", "exceeds"),
    ("string", True, "ff 7f 61", "exceeds"),
    ("bytes", False, "7f ff ff ff 00", "exceeds"),
    # uvarint 2^31: Java's readUnsignedVarint() - 1 is Integer.MIN_VALUE - 1, which
    # wraps to Integer.MAX_VALUE (a huge length); 2^32-1 is the int -1, so -2: null
    ("records", True, "80 80 80 80 08", "exceeds"),
    ("records", True, "ff ff ff ff 0f", "non-nullable"),
    ("[]int32", False, "00 00 00 02 00 00 00 01", "exceeds"),
    ("[]int64", True, "03 00 00 00 00 00 00 00 01", "exceeds"),
    ("string", False, "ff ff 00", "non-nullable"),
    ("bytes", True, "00 00", "non-nullable"),
    ("[]int8", False, "ff ff ff fe 00", "non-nullable"),
    ("string", True, "80 80 80 80 80 01", "longer than 5"),
    ("[]int8", True, "80 80 80 80 80 80", "longer than 5"),
    ("bytes", True, "80 80 80 80 10", "32 bits"),
    ("string", True, "80", "truncated"),
])
def test_bad_lengths(ftype, flexible, wire, why):
    c = _one_field(ftype, flexible)
    with pytest.raises(DecodeError) as ei:
        c.decode(h(wire), 0)
    e = ei.value
    assert why in e.reason, e
    assert e.path == "F" and e.offset == 0 and e.api == "X" and e.version == 0


@pytest.mark.parametrize("ftype,flexible,wire", [
    ("string", False, "ff fe 00"), ("string", False, "80 00 00"),
    ("bytes", False, "ff ff ff fe 00"), ("records", False, "80 00 00 00 00"),
    ("[]int32", False, "80 00 00 00 00"), ("[]string", False, "ff ff ff fd 00"),
    ("[]S", False, "ff ff ff f0 00"),
])
def test_any_negative_length_is_null_in_nullable_fields(ftype, flexible, wire):
    """Kafka's generated readers take any negative length of a nullable string,
    bytes, records or array as null (``if (length < 0) null``), not only -1."""
    c = _one_field(ftype, flexible, nullable=True)
    m = c.decode(h(wire), 0)
    assert m.F is None and m.G == 0


@pytest.mark.parametrize("ftype,wire", [
    ("string", "ff fe 00"), ("bytes", "ff ff ff fe 00"), ("records", "80 00 00 00 00"),
    ("[]int32", "80 00 00 00 00"), ("[]S", "ff ff ff f0 00"),
])
def test_any_negative_length_is_an_error_in_non_nullable_fields(ftype, wire):
    """("non-nullable field F was serialized as null", in Kafka's words)"""
    c = _one_field(ftype)
    with pytest.raises(DecodeError) as ei:
        c.decode(h(wire), 0)
    assert "non-nullable" in ei.value.reason and ei.value.path == "F"
    assert ei.value.offset == 0


@pytest.mark.parametrize("wire", ["7f ff ff ff", "80 80 80 80 08"])
def test_huge_struct_array_counts_fail_before_allocating(wire):
    """A 5-byte frame claiming 2^31-1 elements is a clean error (KAFKA-14063). (The
    compact count: uvarint 2^31, which Java's int arithmetic turns into
    Integer.MAX_VALUE elements.)"""
    reg = corpus_registry()
    mc = reg.codec("MetadataResponse")
    version = 1 if wire.startswith("7f") else 12
    body = h("00 00 00 00" if version == 12 else "") + h(wire)  # ThrottleTimeMs, Brokers count
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as ei:
            mc.decode(body, version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "exceeds" in ei.value.reason and ei.value.path == "Brokers"
    assert peak < 1 << 20


def test_zero_width_elements_are_bounded_by_bytes_left():
    """Elements that take no bytes (all fields absent in this version) cannot make a
    huge count loop: counts are checked against the bytes left, as Kafka does."""
    c = inline({"name": "Z", "type": "data", "validVersions": "0-1", "flexibleVersions": "none",
                "fields": [{"name": "A", "type": "[]E", "versions": "0+", "fields": [
                    {"name": "V", "type": "int8", "versions": "1+"}]}]})
    for wire in ("7f ff ff ff", "00 00 00 02"):
        with pytest.raises(DecodeError) as ei:
            c.decode(h(wire), 0)
        assert "exceeds" in ei.value.reason and ei.value.path == "A"
    assert c.decode(h("00 00 00 00"), 0).A == []


def _nested_zero_width():
    return inline({"name": "Z", "type": "data", "validVersions": "0-1", "flexibleVersions": "none",
                   "fields": [{"name": "Outer", "type": "[]O", "versions": "0+", "fields": [
                       {"name": "Inner", "type": "[]E", "versions": "0+", "fields": [
                           {"name": "V", "type": "int8", "versions": "1+"}]}]}]})


def _outer(*inner: int) -> bytes:
    """Outer's count, then each element's Inner count (its elements take no bytes)."""
    return struct.pack(f">{len(inner) + 1}i", len(inner), *inner)


def test_elements_that_take_no_bytes_are_counted_for_the_whole_frame():
    """Each array's count is checked against the bytes left, but elements that take
    no bytes leave the bytes for the next array to claim again: nested, a frame of L
    bytes would build some L**2/8 elements. All such elements of one decode together
    may be at most as many as the bytes decoded."""
    c = _nested_zero_width()
    # 44 bytes; the first count may be 36 (the bytes after it), the second 32:
    # 36 + 8 elements spend every byte
    v = c.decode(_outer(36, 8, *[0] * 8), 0)
    assert [len(o.Inner) for o in v.Outer] == [36, 8] + [0] * 8
    with pytest.raises(DecodeError) as ei:
        c.decode(_outer(36, 9, *[0] * 8), 0)  # one element more than the 44 bytes
    assert ei.value.path == "Outer[1].Inner" and ei.value.offset == 8
    assert "take no bytes" in ei.value.reason and ei.value.expected == "array length"
    # each inner array claims every byte left: refused early, having built little
    n = 1000
    frame = _outer(*[4 * (n - i) for i in range(1, n + 1)])
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as ei:
            c.decode(frame, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ei.value.path == "Outer[1].Inner"
    assert peak < 1 << 20


def test_frame_level_errors():
    codec = corpus_codec()
    with pytest.raises(DecodeError) as ei:
        codec.decode_request(h("00 03 00 01"))
    assert ei.value.offset == 0
    # Metadata v1 request with a truncated client id
    with pytest.raises(DecodeError) as ei:
        codec.decode_request(h("00 03 00 01 00 00 00 07 00 05 61 62"))
    assert ei.value.path == "ClientId" and ei.value.offset == 8
    # valid header, truncated body: the error names the api
    with pytest.raises(DecodeError) as ei:
        codec.decode_request(h("00 03 00 01 00 00 00 07 00 01 61 00 00 00 02 00 01"))
    e = ei.value
    assert e.api == "Metadata" and e.version == 1 and e.path == "Topics[0].Name"
    assert e.offset == 15
    with pytest.raises(DecodeError) as ei:
        codec.decode_response(h("00 00 00 07 00"), 3, 1)
    assert ei.value.api == "Metadata"
    with pytest.raises(DecodeError):
        codec.response_correlation_id(b"\x00")


def test_decode_error_to_dict():
    c = _one_field("string")
    with pytest.raises(DecodeError) as ei:
        c.decode(h("00 05 61"), 0)
    d = ei.value.to_dict()
    assert d["path"] == "F" and d["offset"] == 0 and d["api"] == "X" and d["version"] == 0
    assert "exceeds" in d["error"]


@pytest.mark.parametrize("flexible", [False, True])
def test_arrays_of_fixed_width_structs_leave_no_memory_behind(flexible):
    """Decoding an array of fixed-width structs keeps nothing that grows with the
    element count. (A struct format of ``n`` repeated element formats was built and
    cached per count: 40 frames of 3000..3039 elements, 1 MB of input, held 5 MB for
    good.) The generated Python decoder is called directly: it is what decodes every
    frame without the C path, and any frame the C path declines."""
    c = inline({"name": "A", "type": "data", "validVersions": "0",
                "flexibleVersions": "0+" if flexible else "none",
                "fields": [{"name": "P", "type": "[]PS", "versions": "0+", "fields": [
                    {"name": "I", "type": "int32", "versions": "0+"},
                    {"name": "L", "type": "int64", "versions": "0+"}]}]})
    P = c.spec.struct.field("P").struct.cls
    cv = c.compiled(0)
    frames = [c.encode(c.cls(P=[P(I=i, L=-i) for i in range(n)]), 0) for n in range(3000, 3040)]
    cv.decode(frames[0], 0, len(frames[0]))  # anything built once per process
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, raw in zip(range(3000, 3040), frames):
            value, end = cv.decode(raw, 0, len(raw))
            assert end == len(raw) and len(value.P) == n and value.P[-1].L == 1 - n
            del value
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 64 << 10, held
    # the same through MessageCodec.decode (the C path when it is built)
    assert c.decode(frames[-1], 0).P[5].I == 5


@pytest.mark.parametrize("flexible,wire,end,offset,expected,path", [
    # int32 A, then int32 B: B would need the bytes after `end`
    (False, "00 00 00 05 00 00 00 07", 6, 4, "int32", "B"),
    (False, "00 00 00 05 00 00 00 07", 2, 0, "int32", "A"),
    # the tag section would start at `end`
    (True, "00 00 00 05 00 00 00 07 00", 8, 8, "tag section", None),
    # a tag of the tag section lies past `end`
    (True, "00 00 00 05 00 00 00 07 01 00 00", 9, 8, "tag section", None),
])
def test_decode_from_reads_nothing_at_or_after_end(flexible, wire, end, offset, expected, path):
    """``decode_from(buf, v, pos, end)`` and ``decode`` treat ``end`` as the end of
    the message: a message that needs bytes past it is truncated there (a
    DecodeError with the offset and what was expected), whatever follows in
    ``buf``."""
    c = inline({"name": "E", "type": "data", "validVersions": "0",
                "flexibleVersions": "0+" if flexible else "none",
                "fields": [{"name": "A", "type": "int32", "versions": "0+"},
                           {"name": "B", "type": "int32", "versions": "0+"}]})
    buf = h(wire)
    for call in (c.decode_from, c.decode):
        with pytest.raises(DecodeError) as ei:
            call(buf, 0, 0, end)
        e = ei.value
        assert e.offset == offset and "truncated" in e.reason, e
        if expected is not None:
            assert e.expected == expected, e
        if path is not None:
            assert e.path == path, e
    # a message that fits before `end` is read up to there, bytes stay bytes
    full = len(buf) if flexible else 8
    value, p = c.decode_from(buf + b"\xff\xff", 0, 0, full)
    assert (value.A, value.B, p) == (5, 7, full)


def test_decode_from_end_keeps_value_types_and_bounds():
    c = inline({"name": "E", "type": "data", "validVersions": "0", "flexibleVersions": "none",
                "fields": [{"name": "B", "type": "bytes", "versions": "0+"},
                           {"name": "U", "type": "uuid", "versions": "0+"}]})
    raw = c.encode(c.cls(B=b"ab", U=bytes(range(16))), 0)
    value, p = c.decode_from(raw + b"\x00" * 7, 0, 0, len(raw))
    assert p == len(raw) and type(value.B) is bytes and type(value.U) is bytes
    with pytest.raises(DecodeError) as ei:
        c.decode_from(raw, 0, 0, len(raw) - 1)
    assert ei.value.path == "U" and ei.value.offset == 6
    for pos, end in ((3, 2), (0, len(raw) + 1), (-1, 2)):
        with pytest.raises(DecodeError, match="not a range"):
            c.decode_from(raw, 0, pos, end)


def _peek_codec(flexible=False):
    return inline({"name": "K", "type": "data", "validVersions": "0",
                   "flexibleVersions": "0+" if flexible else "none",
                   "fields": [{"name": "A", "type": "string", "versions": "0+"},
                              {"name": "N", "type": "string", "versions": "0+",
                               "nullableVersions": "0+"},
                              {"name": "B", "type": "int16", "versions": "0+"}]})


@pytest.mark.parametrize("flexible,wire", [
    (False, "00 02 c3 28 | ff ff | 00 05"), (True, "03 c3 28 | 00 | 00 05")])
def test_peek_field_skips_strings_without_decoding_and_raises_decode_error(flexible, wire):
    """peek_field skips the strings before the field it reads without decoding them;
    invalid UTF-8 in what it reads is kept as a decode keeps it (lone surrogates,
    as Kafka's reader takes it rather than failing); truncation in what it reads or
    must skip is a DecodeError with offset and path, never struct.error."""
    c = _peek_codec(flexible)
    buf = h(wire)
    assert c.peek_field(buf, 0, 0, "B") == 5
    assert c.peek_field(buf, 0, 0, "N") is None
    a = c.peek_field(buf, 0, 0, "A")
    assert a == "\udcc3(" and a.encode("utf-8", "surrogateescape") == b"\xc3\x28"
    with pytest.raises(DecodeError) as ei:
        c.peek_field(buf[:-1], 0, 0, "B")
    assert ei.value.path == "B" and "truncated" in ei.value.reason
    with pytest.raises(DecodeError) as ei:
        c.peek_field(buf[:2], 0, 0, "B")
    assert ei.value.path == "A" and ei.value.offset == 0
    null_a = h("ff ff ff ff 00 05" if not flexible else "00 00 00 05")
    with pytest.raises(DecodeError) as ei:
        c.peek_field(null_a, 0, 0, "B")
    assert ei.value.path == "A" and "non-nullable" in ei.value.reason


@pytest.mark.parametrize("flexible", [False, True])
def test_strings_longer_than_32767_bytes_are_refused_both_ways(flexible):
    """Kafka's generated code throws "string field X had invalid length" on read
    (compact strings too, whose varint length could say more) and "'X' field is too
    long to be serialized" on write. An int16 length cannot say more than 32767."""
    from kinspect.codec import EncodeError

    c = _one_field("string", flexible)
    for n, ok in ((32767, True), (32768, False)):
        value = c.cls(F="a" * n, G=1)
        if ok:
            raw = c.encode(value, 0)
            assert c.decode(raw, 0) == value
            assert c.peek_field(raw, 0, 0, "G") == 1
            continue
        with pytest.raises(EncodeError) as ei:
            c.encode(value, 0)
        assert "32767" in ei.value.reason and ei.value.path == "X.F"
        if not flexible:
            continue
        raw = h("81 80 02") + b"a" * n + b"\x01\x00"  # uvarint 32769: 32768 bytes
        with pytest.raises(DecodeError) as ei:
            c.decode(raw, 0)
        assert "32767" in ei.value.reason and ei.value.path == "F" and ei.value.offset == 0
        with pytest.raises(DecodeError, match="32767"):
            c.top_level_tags(raw, 0)
        with pytest.raises(DecodeError, match="32767"):
            c.peek_field(raw, 0, 0, "G")
    with pytest.raises(EncodeError, match="32767"):
        c.encode(c.cls(F="é" * 16384), 0)  # 32768 bytes of UTF-8
