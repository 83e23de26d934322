"""Fidelity: every feature of the message-definition format behaves as Kafka's
generator does. Expected bytes are written by hand from the protocol guide
(kafka.apache.org/protocol: "Protocol Primitive Types") and KIP-482/KIP-893, not
taken from kinspect's own output.
"""

from __future__ import annotations

import base64
import math

import pytest
from codec_util import corpus_codec, corpus_registry, h, inline

from kinspect.codec import DecodeError, EncodeError, SpecError
from kinspect.codec.compiler import read_uvarint, write_uvarint

# ---------------------------------------------------------------------------
# primitives

PRIMS = {
    "name": "PrimsData", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "Bool", "type": "bool", "versions": "0+"},
        {"name": "I8", "type": "int8", "versions": "0+"},
        {"name": "I16", "type": "int16", "versions": "0+"},
        {"name": "U16", "type": "uint16", "versions": "0+"},
        {"name": "I32", "type": "int32", "versions": "0+"},
        {"name": "U32", "type": "uint32", "versions": "0+"},
        {"name": "I64", "type": "int64", "versions": "0+"},
        {"name": "F64", "type": "float64", "versions": "0+"},
        {"name": "Str", "type": "string", "versions": "0+"},
        {"name": "Id", "type": "uuid", "versions": "0+"},
        {"name": "Raw", "type": "bytes", "versions": "0+"},
        {"name": "Recs", "type": "records", "versions": "0+", "nullableVersions": "0+"},
        {"name": "Ints", "type": "[]int32", "versions": "0+"},
        {"name": "Strs", "type": "[]string", "versions": "0+"},
    ],
}

PRIM_VALUES = dict(Bool=True, I8=-2, I16=-2, U16=65535, I32=0x01020304, U32=4294967295, I64=-1,
                   F64=1.5, Str="hé", Id=bytes(range(16)), Raw=b"\x00\xff", Recs=None,
                   Ints=[1, -1], Strs=["a"])

FIXED_PART = h("01 | fe | ff fe | ff ff | 01 02 03 04 | ff ff ff ff | ff ff ff ff ff ff ff ff |"
               "3f f8 00 00 00 00 00 00")
ID = bytes(range(16)).hex()


def test_primitives_v0_match_the_protocol_guide():
    c = inline(PRIMS)
    want = FIXED_PART + h(
        "00 03 68 c3 a9 |" + ID + "| 00 00 00 02 00 ff | ff ff ff ff |"
        "00 00 00 02 00 00 00 01 ff ff ff ff | 00 00 00 01 00 01 61")
    value = c.cls(**PRIM_VALUES)
    assert c.encode(value, 0) == want
    assert c.decode(want, 0) == value


def test_primitives_v1_use_compact_forms_and_a_tag_section():
    c = inline(PRIMS)
    want = FIXED_PART + h(
        "04 68 c3 a9 |" + ID + "| 03 00 ff | 00 | 03 00 00 00 01 ff ff ff ff | 02 02 61 | 00")
    value = c.cls(**PRIM_VALUES)
    assert c.encode(value, 1) == want
    back = c.decode(want, 1)
    assert back == value and back.Str == "hé" and back.Recs is None


def test_bool_decodes_any_nonzero_byte_as_true():
    """Kafka reads a boolean as ``readByte() != 0``."""
    c = inline({"name": "B", "type": "data", "validVersions": "0", "flexibleVersions": "none",
                "fields": [{"name": "X", "type": "bool", "versions": "0+"}]})
    assert c.decode(b"\x00", 0).X is False
    assert c.decode(b"\x01", 0).X is True
    assert c.decode(b"\x02", 0).X is True


@pytest.mark.parametrize("n,wire", [(0, "00"), (1, "01"), (127, "7f"), (128, "80 01"),
                                    (300, "ac 02"), (16383, "ff 7f"), (16384, "80 80 01"),
                                    (2**32 - 1, "ff ff ff ff 0f")])
def test_unsigned_varint(n, wire):
    out = bytearray()
    write_uvarint(out, n)
    assert bytes(out) == h(wire)
    assert read_uvarint(h(wire) + b"\x99", 0) == (n, len(h(wire)))


def test_long_compact_string_length_is_a_multibyte_varint():
    c = inline(PRIMS)
    value = c.cls(**{**PRIM_VALUES, "Str": "x" * 200})
    raw = c.encode(value, 1)
    i = len(FIXED_PART)
    assert raw[i:i + 2] == h("c9 01")  # 201 = 200 + 1
    assert c.decode(raw, 1).Str == "x" * 200


@pytest.mark.parametrize("field,bad", [("I8", 128), ("I8", -129), ("U16", -1), ("U16", 65536),
                                       ("U32", -1), ("U32", 2**32), ("I64", 2**63),
                                       ("I32", "1"), ("Bool", None), ("Str", None),
                                       ("Raw", None), ("Ints", None), ("Str", 5)])
def test_out_of_range_or_wrong_type_raises_encode_error_with_path(field, bad):
    c = inline(PRIMS)
    value = c.cls(**{**PRIM_VALUES, field: bad})
    with pytest.raises(EncodeError) as ei:
        c.encode(value, 1)
    assert ei.value.path == f"PrimsData.{field}"


@pytest.mark.parametrize("version", [0, 1])
def test_bytes_fields_and_uuids_are_written_by_their_bytes_not_their_item_count(version):
    """A memoryview of wider items (an int32 array's, a 2-D one) is written as the
    bytes it holds, with their count as the length: not its item count (which gave
    a length prefix that disagreed with the data, a frame no reader can follow).
    Other buffer types (array.array) are refused like any non-bytes value."""
    import array

    c = inline(PRIMS)
    ints = array.array("i", range(4))  # 16 bytes, 4 items
    raw = bytes(memoryview(ints))
    flat = memoryview(bytes(range(16)))
    for field, view, plain in [("Raw", memoryview(ints), raw), ("Recs", memoryview(ints), raw),
                               ("Id", memoryview(ints), raw),
                               ("Raw", flat.cast("B", (4, 4)), bytes(range(16))),
                               ("Id", flat.cast("B", (2, 8)), bytes(range(16)))]:
        wire = c.encode(c.cls(**{**PRIM_VALUES, field: view}), version)
        assert wire == c.encode(c.cls(**{**PRIM_VALUES, field: plain}), version), field
        assert getattr(c.decode(wire, version), field) == plain
    for field, bad in [("Raw", ints), ("Recs", ints), ("Id", array.array("B", range(16))),
                       ("Id", ints), ("Id", memoryview(array.array("i", range(16))))]:
        with pytest.raises(EncodeError) as ei:
            c.encode(c.cls(**{**PRIM_VALUES, field: bad}), version)
        assert ei.value.path == f"PrimsData.{field}", (field, bad)


def test_int_array_element_out_of_range_names_the_field():
    c = inline(PRIMS)
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(**{**PRIM_VALUES, "Ints": [1, 2**31]}), 0)
    assert "Ints" in ei.value.path


def test_float64_special_values_round_trip():
    c = inline(PRIMS)
    for f in (math.inf, -math.inf, -0.0, 5e-324):
        back = c.decode(c.encode(c.cls(**{**PRIM_VALUES, "F64": f}), 0), 0)
        assert back.F64 == f and math.copysign(1, back.F64) == math.copysign(1, f)
    nan = c.decode(c.encode(c.cls(**{**PRIM_VALUES, "F64": math.nan}), 0), 0)
    assert math.isnan(nan.F64)


# ---------------------------------------------------------------------------
# validVersions, flexibleVersions (message and field level)

def test_versions_outside_valid_versions_are_rejected():
    c = inline(PRIMS)
    with pytest.raises(EncodeError):
        c.encode(c.cls(**PRIM_VALUES), 2)
    with pytest.raises(DecodeError) as ei:
        c.decode(b"", 2)
    assert ei.value.version == 2


def test_field_level_flexible_versions_override_the_message():
    """A string with ``"flexibleVersions": "none"`` keeps its int16 length in a
    flexible version (RequestHeader ClientId, KIP-482); an override narrower than the
    message's flexible versions keeps the old form until it starts. (One wider than
    the message's is refused, as Kafka's generator refuses it.)"""
    c = inline({"name": "F", "type": "data", "validVersions": "0-2", "flexibleVersions": "1+",
                "fields": [
                    {"name": "A", "type": "string", "versions": "0+", "flexibleVersions": "none"},
                    {"name": "B", "type": "bytes", "versions": "0+", "flexibleVersions": "2+"}]})
    v = c.cls(A="ab", B=b"\x07")
    assert c.encode(v, 0) == h("00 02 61 62 | 00 00 00 01 07")
    assert c.encode(v, 1) == h("00 02 61 62 | 00 00 00 01 07 | 00")
    assert c.encode(v, 2) == h("00 02 61 62 | 02 07 | 00")
    for version in (1, 2):
        assert c.decode(c.encode(v, version), version) == v


def test_request_header_client_id_is_a_non_compact_nullable_string():
    codec = corpus_codec()
    hdr = codec.registry.header("RequestHeader")
    value = hdr.cls(RequestApiKey=18, RequestApiVersion=3, CorrelationId=7, ClientId="kp")
    assert hdr.encode(value, 2) == h("00 12 | 00 03 | 00 00 00 07 | 00 02 6b 70 | 00")
    assert hdr.encode(value, 1) == h("00 12 | 00 03 | 00 00 00 07 | 00 02 6b 70")
    value.ClientId = None
    assert hdr.encode(value, 2) == h("00 12 | 00 03 | 00 00 00 07 | ff ff | 00")


# ---------------------------------------------------------------------------
# nullableVersions

NULLS = {
    "name": "NullsData", "type": "data", "validVersions": "0-2", "flexibleVersions": "2+",
    "fields": [
        {"name": "S", "type": "string", "versions": "0+", "nullableVersions": "1+"},
        {"name": "B", "type": "bytes", "versions": "0+", "nullableVersions": "1+"},
        {"name": "A", "type": "[]int16", "versions": "0+", "nullableVersions": "1+"},
        {"name": "R", "type": "records", "versions": "0+", "nullableVersions": "1+"},
        {"name": "T", "type": "[]Elem", "versions": "0+", "nullableVersions": "1+",
         "fields": [{"name": "X", "type": "int8", "versions": "0+"}]},
    ],
}


def test_nulls_in_nullable_versions():
    c = inline(NULLS)
    v = c.cls(S=None, B=None, A=None, R=None, T=None)
    assert c.encode(v, 1) == h("ff ff | ff ff ff ff | ff ff ff ff | ff ff ff ff | ff ff ff ff")
    assert c.encode(v, 2) == h("00 00 00 00 00 | 00")
    assert c.decode(h("00 00 00 00 00 00"), 2) == v


@pytest.mark.parametrize("field", ["S", "B", "A", "R", "T"])
def test_null_in_a_non_nullable_version_is_an_encode_error(field):
    c = inline(NULLS)
    v = c.cls(S="", B=b"", A=[], R=b"", T=[])
    setattr(v, field, None)
    with pytest.raises(EncodeError) as ei:
        c.encode(v, 0)
    assert field in ei.value.path


@pytest.mark.parametrize("wire,path", [
    ("ff ff | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00", "S"),
    ("00 00 | ff ff ff ff | 00 00 00 00 | 00 00 00 00 | 00 00 00 00", "B"),
    ("00 00 | 00 00 00 00 | ff ff ff ff | 00 00 00 00 | 00 00 00 00", "A"),
    ("00 00 | 00 00 00 00 | 00 00 00 00 | ff ff ff ff | 00 00 00 00", "R"),
    ("00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00 | ff ff ff ff", "T"),
])
def test_null_on_the_wire_in_a_non_nullable_version_is_a_decode_error(wire, path):
    c = inline(NULLS)
    with pytest.raises(DecodeError) as ei:
        c.decode(h(wire), 0)
    assert ei.value.path == path


def test_empty_values_differ_from_null():
    c = inline(NULLS)
    v = c.cls(S="", B=b"", A=[], R=b"", T=[])
    assert c.encode(v, 2) == h("01 01 01 01 01 | 00")
    assert c.decode(c.encode(v, 1), 1) == v


# ---------------------------------------------------------------------------
# KIP-893 nullable structs (NullableStructMessage from Kafka's generator tests)

def _nsm():
    return corpus_registry().codec("NullableStructMessage")


def _my(c, name, s, i):
    return c.spec.struct.field(name).struct.cls(MyString=s, MyInt=i)


def test_nullable_struct_defaults_match_the_generator():
    c = _nsm()
    m = c.cls()
    assert m.NullableStruct is None                      # default "null"
    assert m.NullableStruct2 == _my(c, "NullableStruct2", "", 0)
    assert m.NullableStruct3 is None                     # tagged, default "null"
    assert m.NullableStruct4 == _my(c, "NullableStruct4", "", 0)
    assert c.decode(c.encode(m, 2), 2) == m


def test_non_tagged_nullable_struct_has_an_int8_marker():
    c = _nsm()
    m = c.cls()
    # v0: NullableStruct nullable (marker ff), NullableStruct2 not nullable (no marker)
    assert c.encode(m, 0) == h("ff | 00 00 | 00 00 00 00")
    m.NullableStruct = _my(c, "NullableStruct", "1", 1)
    assert c.encode(m, 0) == h("01 00 01 31 00 00 00 01 | 00 00 00 00 00 00")
    # v1 (flexible): markers stay int8; struct bodies get compact strings + tag sections
    m.NullableStruct2 = None
    assert c.encode(m, 1) == h("01 02 31 00 00 00 01 00 | ff | 00")
    m.NullableStruct2 = _my(c, "NullableStruct2", "2", 2)
    raw = c.encode(m, 1)
    assert raw == h("01 02 31 00 00 00 01 00 | 01 02 32 00 00 00 02 00 | 00")
    assert c.decode(raw, 1) == m


def test_nullable_struct_cannot_be_null_before_its_nullable_versions():
    c = _nsm()
    m = c.cls(NullableStruct2=None)
    with pytest.raises(EncodeError) as ei:
        c.encode(m, 0)
    assert "NullableStruct2" in ei.value.path


def test_tagged_nullable_structs_have_a_uvarint_marker():
    c = _nsm()
    # NullableStruct3: tagged, default null -> written only when present (marker 1)
    m = c.cls(NullableStruct3=_my(c, "NullableStruct3", "3", 3))
    assert c.encode(m, 1) == h("ff | 01 01 00 00 00 00 00 | 01 | 00 08 | 01 02 33 00 00 00 03 00")
    # NullableStruct4: tagged, non-null default -> null is written (marker 0)
    m = c.cls(NullableStruct4=None)
    raw = c.encode(m, 1)
    assert raw == h("ff | 01 01 00 00 00 00 00 | 01 | 01 01 00")
    back = c.decode(raw, 1)
    assert back.NullableStruct4 is None and back == m
    # and a non-default value is written with marker 1
    m = c.cls(NullableStruct4=_my(c, "NullableStruct4", "4", 4))
    assert c.encode(m, 1) == h("ff | 01 01 00 00 00 00 00 | 01 | 01 08 01 02 34 00 00 00 04 00")


@pytest.mark.parametrize("marker", ["00", "02", "7f"])
def test_any_non_negative_non_tagged_marker_means_present(marker):
    """Kafka's generated reader: ``if (_readable.readByte() < 0) null else read``."""
    c = _nsm()
    m = c.decode(h(marker + "| 00 01 31 00 00 00 01 | 00 00 00 00 00 00"), 0)
    assert m.NullableStruct == _my(c, "NullableStruct", "1", 1)


@pytest.mark.parametrize("marker", ["ff", "fe", "80"])
def test_any_negative_non_tagged_marker_means_null(marker):
    c = _nsm()
    m = c.decode(h(marker + "| 00 00 | 00 00 00 00"), 0)
    assert m.NullableStruct is None


@pytest.mark.parametrize("marker,null", [
    ("00", True), ("02", False), ("7f", False), ("ff ff ff ff 07", False),
    ("80 80 80 80 08", True), ("ff ff ff ff 0f", True)])
def test_tagged_marker_is_null_when_kafka_reads_it_as_an_int_not_above_zero(marker, null):
    """Kafka's generated reader: ``if (_readable.readUnsignedVarint() <= 0) null``,
    the varint read into a Java int: 0 and 2^31 and above are null."""
    c = _nsm()
    body = "" if null else "02 34 00 00 00 04 00"
    data = h(marker + body)
    wire = h("ff | 01 01 00 00 00 00 00 | 01 | 01") + bytes([len(data)]) + data
    m = c.decode(wire, 1)
    if null:
        assert m.NullableStruct4 is None
    else:
        assert m.NullableStruct4 == _my(c, "NullableStruct4", "4", 4)


def test_all_null_round_trip():
    c = _nsm()
    m = c.cls(NullableStruct=None, NullableStruct2=None, NullableStruct3=None,
              NullableStruct4=None)
    back = c.decode(c.encode(m, 2), 2)
    assert back == m and back.NullableStruct4 is None


# ---------------------------------------------------------------------------
# tagged fields (SimpleExampleMessage from Kafka's generator tests)

def _sem():
    return corpus_registry().codec("SimpleExampleMessage")


COMMON = "00 00 00 7b 00 00 00 7b"
# v1 defaults: processId, zeroCopyByteBuffer, nullableZeroCopyByteBuffer, two common
# structs with tag sections, myUint16 = 33000, myUint32 = 1234567, then the tag section
SEM_V1_HEAD = "00" * 16 + "| 01 | 01 |" + COMMON + "00 |" + COMMON + "00 | 80 e8 | 00 12 d6 87"


def test_simple_example_defaults():
    c = _sem()
    m = c.cls()
    assert m.myInt16 == 123 and m.myFloat64 == 12.34 and m.myNullableString is None
    assert m.taggedLong == 0x0CAFCACAFCACAFCA  # hex default
    assert m.taggedUuid == base64.urlsafe_b64decode("H3KKO4NTRPaCWtEmm3vW7A==")
    assert m.myUint16 == 33000 and m.myUint32 == 1234567
    assert m.myCommonStruct.foo == 123 and m.myOtherCommonStruct.bar == 123
    assert m.myTaggedIntArray == [] and m.myBytes == b"" and m.myString == ""
    assert c.encode(m, 0) == h(COMMON + COMMON)
    assert c.encode(m, 1) == h(SEM_V1_HEAD + "| 00")


@pytest.mark.parametrize("field,value,tags", [
    ("myTaggedIntArray", [1], "01 | 00 05 02 00 00 00 01"),
    ("myNullableString", "ab", "01 | 01 03 03 61 62"),
    ("myNullableString", "", "01 | 01 01 01"),
    ("myInt16", 124, "01 | 02 02 00 7c"),
    ("myFloat64", 0.0, "01 | 03 08 00 00 00 00 00 00 00 00"),
    ("myString", "z", "01 | 04 02 02 7a"),
    ("myBytes", b"\x43\x66", "01 | 05 03 03 43 66"),
    ("myBytes", None, "01 | 05 01 00"),  # null in a non-null default is written
    ("taggedUuid", bytes(16), "01 | 06 10" + "00" * 16),
    ("taggedLong", 0, "01 | 07 08 00 00 00 00 00 00 00 00"),
])
def test_tagged_field_written_only_when_not_default(field, value, tags):
    c = _sem()
    m = c.cls(**{field: value})
    raw = c.encode(m, 1)
    assert raw == h(SEM_V1_HEAD + "|" + tags)
    back = c.decode(raw, 1)
    assert getattr(back, field) == value and back == m


def test_tagged_fields_are_written_in_ascending_tag_order():
    c = _sem()
    m = c.cls(myString="blah", myTaggedIntArray=[4], taggedLong=0x123443211234432)
    raw = c.encode(m, 1)
    assert raw == h(SEM_V1_HEAD + "| 03 | 00 05 02 00 00 00 04 | 04 05 05 62 6c 61 68 |"
                    "07 08 01 23 44 32 11 23 44 32")
    assert c.decode(raw, 1) == m


def test_tagged_field_at_its_default_on_the_wire_is_kept_losslessly():
    c = _sem()
    wire = h(SEM_V1_HEAD + "| 01 | 02 02 00 7b")  # myInt16 = 123 = default, but present
    m = c.decode(wire, 1)
    assert m.myInt16 == 123
    assert c.encode(m, 1) == wire          # decode -> encode is byte-identical
    assert c.encode(c.cls(), 1) != wire    # a fresh default value omits it (Kafka)


def test_tagged_struct_and_unknown_tags_in_nested_structs():
    c = _sem()
    spec = c.spec.struct
    ts = spec.field("myTaggedStruct").struct.cls(structId="abc")
    m = c.cls(myTaggedStruct=ts)
    raw = c.encode(m, 2)
    assert raw.endswith(h("01 | 08 05 04 61 62 63 00"))
    assert c.decode(raw, 2).myTaggedStruct.structId == "abc"
    # at v1 the tagged struct does not exist: non-default is not ignorable
    with pytest.raises(EncodeError):
        c.encode(m, 1)


def test_unknown_tag_bytes_are_visible_and_re_encoded():
    c = _sem()
    wire = h(SEM_V1_HEAD + "| 02 | 02 02 00 7c | 0a 03 01 02 03")
    m = c.decode(wire, 1)
    assert m.unknown_tags == {10: b"\x01\x02\x03"}
    assert m.to_dict()["_unknown_tags"] == {"10": "010203"}
    assert c.encode(m, 1) == wire


def test_unknown_tags_no_reader_could_read_back_are_encode_errors():
    """An unknown tagged field is written only when a reader gets it back as the
    same unknown tag (KIP-482: tags are unsigned varints, read into 32 bits): not a
    tag above 2^32-1 (2^32 was written as a varint every reader refuses), nor the
    tag of a field of the struct, tagged at this version (read as that field: here
    the 0x01 as a compact string length) or at another (refused there)."""
    c = _sem()
    top = {2**32 - 1: b"\x01", 99: b""}
    assert c.decode(c.encode(c.cls(unknown_tags=top), 1), 1).unknown_tags == top
    for tags, why in [({2**32: b""}, "outside 0..4294967295"), ({-1: b""}, "outside"),
                      ({4: b"\x01"}, "tag of a field"), ({8: b""}, "tag of a field")]:
        with pytest.raises(EncodeError, match=why) as ei:
            c.encode(c.cls(unknown_tags=tags), 1)
        assert ei.value.path == "SimpleExampleMessage", ei.value


def test_a_nan_default_is_a_default():
    """``"default": "NaN"`` on a float64 field (Kafka reads it with
    ``Double.parseDouble``): a NaN is at that default, although ``NaN != NaN``. Else a
    field absent at a version could not be encoded back (non-default value nan), and a
    tagged field absent from the wire would be written by the encoder."""
    c = inline({"name": "M", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
                "fields": [{"name": "A", "type": "int8", "versions": "0+"},
                           {"name": "Old", "type": "float64", "versions": "1+", "default": "NaN"},
                           {"name": "T", "type": "float64", "versions": "1+",
                            "taggedVersions": "1+", "tag": 0, "default": "NaN"}]})
    nan = "7ff8000000000000"
    for wire, version in [("07", 0), ("07" + nan + "00", 1),
                          ("07" + nan + "01 00 08" + nan, 1),  # T on the wire, at its default
                          ("07 3ff0000000000000 01 00 08 4000000000000000", 1)]:
        v = c.decode(h(wire), version)
        assert c.encode(v, version) == h(wire)
    # values at a NaN default are equal (a NaN read from the wire is no more equal to
    # another than Python's floats are)
    assert c.decode(h("07"), 0) == c.decode(h("07"), 0) == c.cls(A=7)
    with pytest.raises(EncodeError, match="non-default value 1.5 for field Old"):
        c.encode(c.cls(A=1, Old=1.5), 0)
    assert c.encode(c.cls(A=1, T=float("nan")), 1) == h("01" + nan + "00")
    assert c.encode(c.cls(A=1, T=0.5), 1) == h("01" + nan + "01 00 08 3fe0000000000000")


@pytest.mark.parametrize("tagged_fields", [True, False])
def test_unknown_tag_data_is_written_as_the_bytes_it_holds(tagged_fields):
    """Unknown tag data may be a bytearray or a memoryview of any item format: its
    size is its byte count, not its len() (a memoryview of int32 items has len 1 per 4
    bytes); data of another type is an EncodeError, not a TypeError or a corrupt frame.
    Both with and without tagged fields in the struct (two paths of the encoder)."""
    from array import array

    if tagged_fields:
        c, version = _sem(), 1
    else:
        c, version = inline({"name": "M", "type": "data", "validVersions": "0",
                             "flexibleVersions": "0+", "fields": [
                                 {"name": "A", "type": "int8", "versions": "0+"}]}), 0
    data = array("i", [0x01020304, -1])
    m = c.cls(unknown_tags={99: memoryview(data), 98: bytearray(b"ab")})
    back = c.decode(c.encode(m, version), version)
    assert back.unknown_tags == {99: data.tobytes(), 98: b"ab"}
    for bad in ("text", 5, [1, 2]):
        with pytest.raises(EncodeError, match="must be bytes"):
            c.encode(c.cls(unknown_tags={99: bad}), version)


def test_a_foreign_tag_of_a_field_of_another_version_is_written():
    """``ForeignTag``: the tag-tolerance tools (proxy rules, ``kinspect tolerate``) send
    the tag of a field tagged only at later versions (8 and 9 from v2 here) to see
    whether a peer skips it; the encoder writes it at v1, in tag order, and a reader
    refuses it there as Kafka's does. A tag tagged at the version written (4) stays an
    EncodeError, ForeignTag or not."""
    from kinspect.codec.compiler import ForeignTag

    c = _sem()
    m = c.cls(unknown_tags={ForeignTag(8): b"\x01", 99: b""})
    wire = c.encode(m, 1)
    plain = c.encode(c.cls(), 1)
    assert plain.endswith(b"\x00")
    assert wire == plain[:-1] + bytes([2, 8, 1, 1, 99, 0])
    with pytest.raises(DecodeError, match="not valid for version 1"):
        c.decode(wire, 1)
    with pytest.raises(EncodeError, match="tag of a field"):
        c.encode(c.cls(unknown_tags={ForeignTag(4): b"\x01"}), 1)
    with pytest.raises(EncodeError, match="tag of a field"):
        c.encode(c.cls(unknown_tags={ForeignTag(8): b""}), 2)


def _tags_nested():
    return inline({"name": "T", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
                   "fields": [{"name": "A", "type": "int32", "versions": "0+"},
                              {"name": "T1", "type": "int32", "versions": "1+",
                               "taggedVersions": "1+", "tag": 1},
                              {"name": "S", "type": "[]E", "versions": "0+", "fields": [
                                  {"name": "B", "type": "int8", "versions": "0+"}]},
                              {"name": "One", "type": "O", "versions": "0+", "fields": [
                                  {"name": "C", "type": "int8", "versions": "0+"}]}]})


def test_tags_set_on_a_version_without_tag_sections_are_an_encode_error():
    """Kafka's generated writers throw UnsupportedVersionException ("Tagged fields
    were set, but version N of this message does not support them") rather than drop
    unknown tagged fields at a non-flexible version; so does kinspect, at every
    struct level, naming the struct. A known tagged field the version lacks is the
    usual non-default-value error (dropped only when ignorable)."""
    c = _tags_nested()
    E = c.spec.struct.field("S").struct.cls
    O = c.spec.struct.field("One").struct.cls
    cases = [
        (c.cls(A=1, unknown_tags={7: b"\x01"}), "T"),
        (c.cls(A=1, S=[E(B=1), E(B=2, unknown_tags={3: b""})]), "T.S[1]"),
        (c.cls(A=1, One=O(C=1, unknown_tags={4: b"\x00"})), "T.One"),
    ]
    for value, path in cases:
        with pytest.raises(EncodeError) as ei:
            c.encode(value, 0)
        assert "tagged fields" in ei.value.reason and "version 0" in ei.value.reason, ei.value
        assert ei.value.path == path, ei.value
        assert c.decode(c.encode(value, 1), 1) == value  # flexible: written and read back
    with pytest.raises(EncodeError, match="T1"):
        c.encode(c.cls(A=1, T1=5), 0)
    assert c.encode(c.cls(A=1), 0) == h("00 00 00 01 | 00 00 00 00 | 00")


@pytest.mark.parametrize("tags,why", [
    ("02 | 02 02 00 7c | 02 02 00 7c", "tag 2 repeated"),
    ("02 | 0a 00 | 0a 01 05", "tag 10 repeated"),
    ("01 | 02 03 00 7c 00", "declared"),
    ("01 | 02 09 00 7c", "claims"),
])
def test_malformed_tag_sections(tags, why):
    with pytest.raises(DecodeError) as ei:
        _sem().decode(h(SEM_V1_HEAD + "|" + tags), 1)
    assert why in ei.value.reason


# ---------------------------------------------------------------------------
# ignorable

def test_non_ignorable_field_absent_in_version_raises():
    c = _sem()
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(processId=b"\x01" * 16), 0)  # processId is 1+
    assert "processId" in str(ei.value)
    st = c.spec.struct.field("myStruct").struct.cls(structId=10)
    with pytest.raises(EncodeError):
        c.encode(c.cls(myStruct=st), 1)             # myStruct is 2+
    with pytest.raises(EncodeError):
        c.encode(c.cls(zeroCopyByteBuffer=b"x"), 2)  # versions "1"


def test_ignorable_field_absent_in_version_is_dropped():
    c = _sem()
    m = c.cls(taggedLongFlexibleVersionSubset=5)    # ignorable, tagged 2+
    raw = c.encode(m, 1)
    assert raw == h(SEM_V1_HEAD + "| 00")
    assert c.decode(raw, 1).taggedLongFlexibleVersionSubset == 0
    assert c.decode(c.encode(m, 2), 2).taggedLongFlexibleVersionSubset == 5


def test_default_value_in_absent_field_is_fine():
    c = _sem()
    assert c.encode(c.cls(processId=bytes(16)), 0) == h(COMMON + COMMON)


# ---------------------------------------------------------------------------
# custom defaults, mapKey, commonStructs, zeroCopy, entityType

def _one(ftype, default, **extra):
    return inline({"name": "D", "type": "data", "validVersions": "0", "flexibleVersions": "none",
                   "fields": [{"name": "X", "type": ftype, "versions": "0+", "default": default,
                               **extra}]})


# As Kafka's generator reads defaults (generator/.../FieldSpec.java, fieldDefault):
# integers pass Byte/Short/Integer/Long.valueOf(text, base), base 16 after a lower-case
# "0x" it strips, and the text itself becomes a Java literal (so a leading 0 is octal);
# "" is 0 (also what is left of a bare "0x"); booleans are equalsIgnoreCase "true" or
# "false", "" false; float64 is Double.parseDouble(text), "" 0.0.
@pytest.mark.parametrize("ftype,default,value", [
    ("int32", "0x10", 16), ("int32", "0x1f", 31), ("int32", "010", 8), ("int32", "-010", -8),
    ("int32", "+5", 5), ("int8", "0x7f", 127), ("int64", "0xcafcacafcacafca", 0x0CAFCACAFCACAFCA),
    ("int16", "-32768", -32768), ("int8", "0", 0), ("uint16", "65535", 65535),
    ("int32", "-2147483648", -2147483648), ("uint32", "0x10", 16),
    ("int8", "", 0), ("int16", "", 0), ("uint16", "", 0), ("int32", "", 0), ("uint32", "", 0),
    ("int64", "", 0), ("int32", "0x", 0),
    ("bool", "true", True), ("bool", "false", False), ("bool", "TRUE", True),
    ("bool", "False", False), ("bool", "", False), ("bool", True, True),
    ("float64", "1.5", 1.5), ("float64", "", 0.0), ("float64", "1e3", 1000.0),
    ("float64", "2.5d", 2.5), ("float64", "0x1.8p1", 3.0), ("float64", " -Infinity ", -math.inf),
    ("string", "abc", "abc"), ("string", "", ""), ("int32", 7, 7), ("int32", -7, -7),
    ("records", "anything", None),  # the generator's records default is null, unchecked
])
def test_custom_defaults(ftype, default, value):
    c = _one(ftype, default)
    assert c.cls().X == value
    assert c.spec.fields[0].default == value


def test_null_default_needs_nullable_versions():
    assert _one("string", "null", nullableVersions="0+").cls().X is None
    with pytest.raises(SpecError) as ei:
        _one("string", "null")
    assert ei.value.field == "X" and ei.value.source == "inline.json"


@pytest.mark.parametrize("ftype,default", [
    ("int8", "128"), ("uint16", "-1"), ("int32", "x"), ("bool", "yes"), ("bytes", "abc"),
    ("[]int32", "1"),
    # what Java's valueOf(text, 10 or 16) refuses, though Integer.decode or Python's
    # int() would take it
    ("int32", "-0x10"), ("int32", "0X10"), ("int32", "#10"), ("int32", "1_000"),
    ("int32", " 1"), ("int32", "1 "), ("int32", "1.0"), ("int32", 1.5), ("int32", True),
    ("int8", "0x80"), ("int32", "0x80000000"), ("uint32", "-1"), ("int32", "2147483648"),
    # passes valueOf but is no Java literal, so the generated code does not compile
    ("int32", "08"), ("int32", "0x-10"),
    ("bool", "1"), ("bool", "tru"),
    # what Double.parseDouble refuses, though Python's float() would take it
    ("float64", "inf"), ("float64", "nan"), ("float64", "1_0"), ("float64", " "),
])
def test_invalid_defaults_are_spec_errors(ftype, default):
    with pytest.raises(SpecError) as ei:
        _one(ftype, default)
    assert ei.value.field == "X"


def test_map_key_arrays_keep_order_and_duplicates():
    c = inline({"name": "M", "type": "data", "validVersions": "0", "flexibleVersions": "none",
                "fields": [{"name": "Items", "type": "[]Item", "versions": "0+", "fields": [
                    {"name": "Key", "type": "int8", "versions": "0+", "mapKey": True},
                    {"name": "Val", "type": "int8", "versions": "0+"}]}]})
    assert c.spec.fields[0].struct.fields[0].map_key is True
    wire = h("00 00 00 03 | 02 01 | 01 02 | 02 03")
    m = c.decode(wire, 0)
    assert [(i.Key, i.Val) for i in m.Items] == [(2, 1), (1, 2), (2, 3)]
    assert c.encode(m, 0) == wire


def test_common_structs_are_shared_types():
    c = _sem()
    a = c.spec.struct.field("myCommonStruct").struct
    b = c.spec.struct.field("myOtherCommonStruct").struct
    assert a is b and a.cls is b.cls and a.name == "TestCommonStruct"
    assert "TestCommonStruct" in c.spec.common_structs
    m = c.cls()
    m.myCommonStruct.foo = 1
    assert m.myOtherCommonStruct.foo == 123  # defaults are fresh objects


def test_zero_copy_bytes_decode_like_bytes():
    c = _sem()
    f = c.spec.struct.field("zeroCopyByteBuffer")
    assert f.zero_copy
    m = c.decode(c.encode(c.cls(zeroCopyByteBuffer=b"\x01\x02\x03"), 1), 1)
    assert bytes(m.zeroCopyByteBuffer) == b"\x01\x02\x03"
    with pytest.raises(SpecError):
        _one("int32", "0", zeroCopy=True)


def test_entity_types_are_exposed():
    spec = corpus_registry().messages["MetadataResponse"]
    assert spec.struct.field("Brokers").struct.field("NodeId").entity_type == "brokerId"
    assert spec.struct.field("Topics").struct.field("Name").entity_type == "topicName"
    assert corpus_registry().messages["SimpleRecordsMessage"].fields[0].entity_type == "topicName"


def test_records_field():
    c = corpus_registry().codec("SimpleRecordsMessage")
    m = c.cls(Topic="t", RecordSet=b"\x00\x01")
    assert c.encode(m, 0) == h("00 01 74 | 00 00 00 02 00 01")
    assert c.encode(m, 1) == h("02 74 | 03 00 01 | 00")
    assert c.decode(h("02 74 | 00 | 00"), 1).RecordSet is None


def test_simple_arrays_message_struct_array_versions():
    c = corpus_registry().codec("SimpleArraysMessage")
    goat = c.spec.struct.field("Goats").struct.cls
    m = c.cls(Goats=[goat(Color=1, Name="g")], Sheep=[7])
    assert c.encode(m, 2) == h("02 | 01 02 67 00 | 02 00 00 00 07 | 00")
    with pytest.raises(EncodeError):  # Name (2+) is not ignorable
        c.encode(m, 1)
    m.Goats[0].Name = ""
    assert c.encode(m, 1) == h("02 | 01 00 | 02 00 00 00 07 | 00")


# ---------------------------------------------------------------------------
# values: access, repr, dicts

def test_struct_value_api():
    c = _nsm()
    m = c.cls(NullableStruct=_my(c, "NullableStruct", "x", 1))
    assert m["NullableStruct"].MyString == "x"
    assert "NullableStruct" in m and "Nope" not in m
    m["NullableStruct3"] = None
    with pytest.raises(KeyError):
        m["Nope"]
    assert repr(m).startswith("NullableStructMessage(NullableStruct=MyStruct(MyString='x'")
    d = m.to_dict()
    assert d["NullableStruct"] == {"MyString": "x", "MyInt": 1}
    assert c.cls.from_dict(d) == m
    with pytest.raises(EncodeError):
        c.cls.from_dict({"Nope": 1})
    with pytest.raises(TypeError):
        c.cls(Nope=1)
    assert m.copy() == m and m.copy() is not m


def test_to_dict_forms_of_bytes_and_uuids():
    c = _sem()
    m = c.cls(processId=bytes(range(16)), myBytes=b"\xff")
    d = m.to_dict()
    assert d["myBytes"] == "/w=="
    assert d["processId"] == base64.urlsafe_b64encode(bytes(range(16))).decode().rstrip("=")
    assert c.cls.from_dict(d) == m


def test_to_dict_at_a_version_gives_the_fields_on_the_wire_at_it():
    """As Kafka's JSON converters write a message: fields outside their versions are
    left out, tagged fields only when written."""
    import struct

    from kinspect.codec import Codec

    codec = Codec()  # the shipped spec set: Metadata up to v13
    md = codec.registry.codec("MetadataResponse")
    fields = md.spec.struct
    assert str(fields.field("ErrorCode").versions) == "13+"
    assert str(fields.field("ClusterAuthorizedOperations").versions) == "8-10"
    body = md.encode(md.cls(), 12)
    resp = codec.decode_response(struct.pack(">i", 5) + b"\x00" + body, 3, 12)
    d = resp.to_dict()
    assert "ErrorCode" not in d["body"] and "ClusterAuthorizedOperations" not in d["body"]
    assert {"ThrottleTimeMs", "Brokers", "ClusterId", "ControllerId", "Topics"} <= set(d["body"])
    assert d["header"] == {"CorrelationId": 5}
    assert "ErrorCode" in resp.body.to_dict()  # no version: every field of the spec
    assert "ErrorCode" in md.decode(md.encode(md.cls(), 13), 13).to_dict(13)
    assert "ClusterAuthorizedOperations" in md.decode(md.encode(md.cls(), 9), 9).to_dict(9)
    # a tagged field: given when on the wire, at its default only when seen there
    av = codec.registry.codec("ApiVersionsResponse")
    assert av.spec.struct.field("ZkMigrationReady").tagged_in(3)
    assert "ZkMigrationReady" not in av.decode(av.encode(av.cls(), 3), 3).to_dict(3)
    on = av.decode(av.encode(av.cls(ZkMigrationReady=True), 3), 3)
    assert on.to_dict(3)["ZkMigrationReady"] is True
    assert av.cls.from_dict(on.to_dict(3)) == on


# ---------------------------------------------------------------------------
# header special cases (GUIDE section 2, items 1-5)

def test_header_versions_follow_flexible_versions():
    codec = corpus_codec()
    assert codec.request_header_version(3, 8) == 1 and codec.request_header_version(3, 9) == 2
    assert codec.response_header_version(3, 8) == 0 and codec.response_header_version(3, 9) == 1


def test_api_versions_response_always_uses_header_v0():
    codec = corpus_codec()
    assert codec.response_header_version(18, 3) == 0
    resp_codec = codec.response_codec(18)
    body = resp_codec.cls(ErrorCode=0, ApiKeys=[], ThrottleTimeMs=0)
    frame = h("00 00 00 2a") + resp_codec.encode(body, 3)
    resp = codec.decode_response(frame, 18, 3)
    assert resp.correlation_id == 42 and resp.header_version == 0 and resp.body == body
    assert codec.encode_response(resp) == frame


def test_controlled_shutdown_v0_request_header_has_no_client_id():
    codec = corpus_codec()
    frame = h("00 07 | 00 00 | 00 00 00 05 | 00 00 00 03")  # BrokerId 3
    req = codec.decode_request(frame)
    assert req.header_version == 0 and req.client_id is None and req.body.BrokerId == 3
    assert codec.encode_request(req) == frame
    frame1 = h("00 07 | 00 01 | 00 00 00 05 | 00 01 63 | 00 00 00 03")
    req1 = codec.decode_request(frame1)
    assert req1.header_version == 1 and req1.client_id == "c"


def test_flexible_request_header_keeps_a_non_compact_client_id():
    codec = corpus_codec()
    body = h("03 6b 70 | 04 31 2e 30 | 00")  # ClientSoftwareName "kp", Version "1.0"
    frame = h("00 12 | 00 03 | 00 00 00 07 | 00 02 6b 70 | 00") + body
    req = codec.decode_request(frame)
    assert req.header_version == 2 and req.client_id == "kp"
    assert req.body.ClientSoftwareName == "kp" and req.body.ClientSoftwareVersion == "1.0"
    assert codec.encode_request(req) == frame
    head = codec.decode_request(frame, body=False)
    assert head.body is None and head.body_offset == len(frame) - len(body)


def test_unsupported_api_versions_request_is_answered_with_a_v0_body():
    codec = corpus_codec()
    rc = codec.response_codec(18)
    av = rc.spec.struct.field("ApiKeys").struct.cls
    body_v0 = rc.encode(rc.cls(ErrorCode=35, ApiKeys=[av(ApiKey=18, MinVersion=0, MaxVersion=3)]), 0)
    frame = h("00 00 00 09") + body_v0
    resp = codec.decode_response(frame, 18, 4)
    assert resp.body_version == 0 and resp.body.ErrorCode == 35
    assert resp.body.ApiKeys[0].MaxVersion == 3
    assert codec.encode_response(resp) == frame
    # the scanner reads it the same way: a v0 body has no tag section
    assert codec.response_top_level_tags(frame, 18, 4) == frozenset()


def test_unknown_api_key_or_version_is_a_decode_error():
    codec = corpus_codec()
    with pytest.raises(DecodeError) as ei:
        codec.decode_request(h("7f 00 00 00 00 00 00 01 ff ff"))
    assert "no spec" in ei.value.reason
    with pytest.raises(DecodeError) as ei:
        codec.decode_request(h("00 03 00 63 00 00 00 01 ff ff"))
    assert ei.value.api == "Metadata" and ei.value.version == 99


def test_tags_in_any_order_are_read_as_kafka_reads_them():
    """Kafka's generated readers do not check the order of tags; neither does
    kinspect. The encoder writes them in ascending order (so such a frame does not
    re-encode byte for byte)."""
    c = _sem()
    wire = h(SEM_V1_HEAD + "| 03 | 0b 01 07 | 02 02 00 7c | 0a 01 00")
    m = c.decode(wire, 1)
    assert m.myInt16 == 124 and m.unknown_tags == {11: b"\x07", 10: b"\x00"}
    assert list(m.unknown_tags) == [11, 10]  # in wire order
    assert c.encode(m, 1) == h(SEM_V1_HEAD + "| 03 | 02 02 00 7c | 0a 01 00 | 0b 01 07")
    assert c.top_level_tags(wire, 1) == {2, 10, 11}


@pytest.mark.parametrize("tags,tag", [
    ("02 | 02 02 00 7c | 02 02 00 7d", 2),      # a known tag twice
    ("02 | 0a 01 07 | 0a 01 08", 10),           # an unknown tag twice
    ("03 | 0a 01 07 | 02 02 00 7c | 0a 00", 10),  # not adjacent
])
def test_a_tag_repeated_in_one_section_is_a_decode_error(tags, tag):
    """Deliberately stricter than Kafka's readers, which keep the last value of a
    repeated known tag and a list of unknown ones: a struct holds one value per tag
    (unknown tags in a dict), so the frame could not be kept losslessly. The
    scanners reject what the decoder rejects."""
    c = _sem()
    wire = h(SEM_V1_HEAD + "|" + tags)
    with pytest.raises(DecodeError) as ei:
        c.decode(wire, 1)
    assert ei.value.reason == f"tag {tag} repeated in one tag section", ei.value
    assert ei.value.offset > len(h(SEM_V1_HEAD))
    with pytest.raises(DecodeError, match="repeated"):
        c.top_level_tags(wire, 1)


def test_known_tag_outside_its_tagged_versions_is_a_decode_error():
    """taggedLongFlexibleVersionSubset is tag 9 only from v2. At v1 Kafka's reader
    throws "Tag 9 is not valid for version 1"; so does kinspect (and its scans)."""
    c = _sem()
    wire = h(SEM_V1_HEAD + "| 01 | 09 01 05")
    with pytest.raises(DecodeError) as ei:
        c.decode(wire, 1)
    e = ei.value
    assert "tag 9 (taggedLongFlexibleVersionSubset) is not valid for version 1" in e.reason
    assert e.offset == len(h(SEM_V1_HEAD)) + 1
    with pytest.raises(DecodeError, match="not valid for version 1"):
        c.top_level_tags(wire, 1)
    m = c.cls(taggedLongFlexibleVersionSubset=5)
    assert c.decode(c.encode(m, 2), 2) == m


def test_a_tagged_field_longer_than_the_bytes_left_is_reported_at_its_data():
    """The offset of "tagged field N claims M bytes" is where that field's data
    starts (DecodeError.offset: where the failing item starts), as the other errors
    of a tag section name their own tag's offset, not the section's count."""
    c = inline({"name": "TestMessage", "type": "data", "validVersions": "0-1",
                "flexibleVersions": "1+",
                "fields": [{"name": "A", "type": "int32", "versions": "0+"}]})
    # A=1 | two tags: tag 0 (4 bytes) at offset 5, tag 1 (claims 5, 2 left) at 11
    raw = h("00 00 00 01 | 02 | 00 04 00 00 00 01 | 01 05 02 aa")
    with pytest.raises(DecodeError) as ei:
        c.decode(raw, 1)
    assert ei.value.offset == 13, ei.value
    assert "tagged field 1 claims 5 bytes, 2 left" in ei.value.reason


# ---------------------------------------------------------------------------
# field names Python reserves

def _reserved_names():
    return inline({
        "name": "TestMessage", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
        "fields": [
            {"name": "None", "type": "int32", "versions": "0+"},
            {"name": "pass", "type": "string", "versions": "0+", "nullableVersions": "0+"},
            {"name": "copy", "type": "int8", "versions": "0+", "default": 7},
            {"name": "from", "type": "[]Inner", "versions": "0+", "fields": [
                {"name": "lambda", "type": "int64", "versions": "0+"},
                {"name": "get", "type": "bool", "versions": "0+"}]},
            {"name": "class", "type": "Sub", "versions": "0+", "fields": [
                {"name": "defaults", "type": "int16", "versions": "0+", "default": 3}]},
            {"name": "async", "type": "int32", "versions": "1+", "taggedVersions": "1+",
             "tag": 0},
        ]})


@pytest.mark.parametrize("version", [0, 1])
def test_fields_named_like_python_keywords_decode_and_encode(version):
    """Kafka's generator takes any [A-Za-z][A-Za-z0-9]* field name (FieldSpec), a
    Python keyword too (None, pass, from, class, lambda, async): such a field is an
    attribute under its own name (getattr, o[name]) and under name + '_' in code."""
    c = _reserved_names()
    s = c.spec.struct
    Inner = s.field("from").struct.cls
    m = c.cls(**{"None": -5, "pass": "x", "copy": 1, "async": 9 if version else 0,
                 "from": [Inner(**{"lambda": 2 ** 40, "get": True})]})
    raw = c.encode(m, version)
    wire = (h("ff ff ff fb") + (b"\x02x" if version else b"\x00\x01x") + b"\x01"
            + (b"\x02" if version else b"\x00\x00\x00\x01")
            + (2 ** 40).to_bytes(8, "big") + b"\x01" + (b"\x00" if version else b"")
            + b"\x00\x03" + (b"\x00" if version else b"")
            + (h("01 | 00 04 00 00 00 09") if version else b""))
    assert raw == wire
    back = c.decode(raw, version)
    assert back == m and getattr(back, "None") == -5 and back.None_ == -5
    assert back["pass"] == "x" and back.pass_ == "x"
    assert getattr(back.from_[0], "lambda") == 2 ** 40 and back.from_[0].lambda_ == 2 ** 40
    assert getattr(back, "class").defaults == 3
    assert back.async_ == (9 if version else 0)
    assert c.encode(back, version) == raw
    assert c.encode(type(m).from_dict(back.to_dict()), version) == raw
    back.None_ = 6
    assert getattr(back, "None") == 6
    # a field named like a Struct method hides it; the library's own copies go
    # through the class (the fresh default of a struct field, deep copies)
    assert back.copy == 1 and back.from_[0].get is True
    from kinspect.codec import Struct
    dup = Struct.copy(back)
    assert dup == back and dup.from_ is not back.from_ and dup.from_[0] is not back.from_[0]
    assert getattr(c.cls(), "class").defaults == 3


def test_a_keyword_field_decoding_badly_is_a_decode_error_naming_it():
    c = _reserved_names()
    with pytest.raises(DecodeError) as ei:
        c.decode(h("00 00 00 01 | 00 05 61"), 0)  # pass claims 5 bytes, 1 left
    assert "pass" in ei.value.path, ei.value
