"""Edge cases where kinspect reads and writes as Kafka's Java code does, checked
against Kafka's sources (not against kinspect's own output):

* strings: ``Readable.readString`` is ``new String(bytes, UTF_8)``, which replaces
  invalid UTF-8 with U+FFFD instead of failing, so brokers accept such frames;
* compact lengths: generated readers compute ``readUnsignedVarint() - 1`` in Java
  ``int`` arithmetic (``ByteUtils.readUnsignedVarint`` returns an ``int``);
* tagged strings and bytes: generated writers always write them compact
  (``MessageDataGenerator.generateClassWriter``), whatever the field's own
  ``flexibleVersions``;
* encoding refuses values of the wrong type (Java's types do not let them exist);
* ``from_dict`` reports malformed input as EncodeError.
"""

from __future__ import annotations

import enum
import json

import pytest
from codec_util import h, inline

from kinspect.codec import DecodeError, EncodeError, SpecError

# ---------------------------------------------------------------------------
# invalid UTF-8

STRS = {
    "name": "StrsData", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "S", "type": "string", "versions": "0+"},
        {"name": "N", "type": "string", "versions": "0+", "nullableVersions": "0+"},
        {"name": "L", "type": "[]string", "versions": "0+"},
        {"name": "T", "type": "string", "versions": "1+", "taggedVersions": "1+", "tag": 0},
    ],
}

BAD = [b"\xff", b"a\xc3(b", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"ok\x80"]


def _strs_wire(version: int, raw: bytes) -> bytes:
    n = len(raw)
    if version == 0:  # int16 lengths, int32 count
        s = bytes([0, n]) + raw
        return s + s + bytes([0, 0, 0, 1]) + s
    s = bytes([n + 1]) + raw  # compact lengths, then the tag section with tag 0
    return s + s + bytes([2]) + s + bytes([1, 0, n + 1]) + s


@pytest.mark.parametrize("raw", BAD)
@pytest.mark.parametrize("version", [0, 1])
def test_invalid_utf8_decodes_and_encodes_back_to_the_same_bytes(version, raw):
    """Kafka takes such strings (as U+FFFD); kinspect decodes them too, keeping each
    invalid byte as a lone surrogate, and writes back exactly the bytes it read."""
    from kinspect.codec.values import java_string

    c = inline(STRS)
    wire = _strs_wire(version, raw)
    m = c.decode(wire, version)
    values = [m.S, m.N, m.L[0]] + ([m.T] if version else [])
    for v in values:
        assert v.encode("utf-8", "surrogateescape") == raw
        assert java_string(v) == raw.decode("utf-8", "replace")  # what Java shows
    assert c.encode(m, version) == wire
    assert c.peek_field(wire, version, 0, "N") == m.N
    assert c.top_level_tags(wire, version) == (frozenset({0}) if version else frozenset())


def test_invalid_utf8_survives_to_dict_json_and_from_dict():
    c = inline(STRS)
    wire = _strs_wire(1, b"a\xffb")
    m = c.decode(wire, 1)
    text = json.dumps(m.to_dict())  # escaped as \udcff, no UnicodeEncodeError
    assert "\\udcff" in text
    back = c.cls.from_dict(json.loads(text))
    assert back == m and c.encode(back, 1) == wire


def test_a_lone_surrogate_that_no_byte_escapes_is_an_encode_error():
    c = inline(STRS)
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(S="\ud800"), 0)
    assert ei.value.path == "StrsData.S"


def test_strings_are_still_at_most_32767_bytes_with_invalid_utf8():
    c = inline(STRS)
    c.encode(c.cls(S="\udcff" * 32767), 0)
    with pytest.raises(EncodeError, match="32767"):
        c.encode(c.cls(S="\udcff" * 32768), 0)


def test_request_with_invalid_utf8_client_id_decodes_and_renders(tmp_path):
    """A request whose ClientId is not UTF-8 (brokers accept it) decodes, renders
    in the tree and JSON views and re-encodes byte for byte."""
    from rich.console import Console

    from kinspect.codec import Codec
    from kinspect.commands.decode import _tree, message_to_dict

    codec = Codec()
    body = codec.registry.codec("ApiVersionsRequest").encode(
        codec.registry.codec("ApiVersionsRequest").cls(), 0)
    frame = h("00 12 00 00 00 00 00 07 00 03") + b"k\xffs" + body
    msg = codec.decode_request(frame)
    assert msg.client_id == "k\udcffs"
    assert json.loads(json.dumps(message_to_dict(msg)))["header"]["ClientId"] == "k\udcffs"
    out = tmp_path / "tree.txt"
    with open(out, "w", encoding="utf-8") as fh:
        Console(file=fh, width=120).print(_tree(msg))
    assert "ClientId" in out.read_text(encoding="utf-8")
    assert codec.encode_request(msg) == frame


# ---------------------------------------------------------------------------
# compact lengths of 2^31 and more


def _field(ftype, nullable):
    elems = {"fields": [{"name": "V", "type": "int8", "versions": "0+"}]} if ftype == "[]E" else {}
    return inline({"name": "X", "type": "data", "validVersions": "0", "flexibleVersions": "0+",
                   "fields": [{"name": "F", "type": ftype, "versions": "0+", **elems,
                               **({"nullableVersions": "0+"} if nullable else {})},
                              {"name": "G", "type": "int8", "versions": "0+"}]})


# readUnsignedVarint() of these is a negative Java int, so length = that - 1 < 0
NEGATIVE = ["81 80 80 80 08", "ff ff ff ff 0f", "80 80 80 80 0c"]
TYPES = ["string", "bytes", "records", "[]int32", "[]string", "[]E"]


@pytest.mark.parametrize("ftype", TYPES)
@pytest.mark.parametrize("prefix", NEGATIVE)
def test_compact_length_from_2_31_up_is_null_in_nullable_fields(ftype, prefix):
    c = _field(ftype, True)
    wire = h(prefix) + h("07 00")
    m = c.decode(wire, 0)
    assert m.F is None and m.G == 7
    assert c.top_level_tags(wire, 0) == frozenset()
    if ftype in ("string", "bytes", "records"):
        assert c.peek_field(wire, 0, 0, "G") == 7
        assert c.peek_field(wire, 0, 0, "F") is None


@pytest.mark.parametrize("ftype", TYPES)
@pytest.mark.parametrize("prefix", NEGATIVE)
def test_compact_length_from_2_31_up_is_an_error_in_non_nullable_fields(ftype, prefix):
    c = _field(ftype, False)
    wire = h(prefix) + h("07 00")
    with pytest.raises(DecodeError) as ei:
        c.decode(wire, 0)
    assert "non-nullable" in ei.value.reason and ei.value.path == "F"
    with pytest.raises(DecodeError):
        c.top_level_tags(wire, 0)


@pytest.mark.parametrize("ftype", TYPES)
@pytest.mark.parametrize("nullable", [False, True])
def test_compact_length_of_exactly_2_31_is_a_huge_length(ftype, nullable):
    """Integer.MIN_VALUE - 1 wraps to Integer.MAX_VALUE in Java: not null, a length
    no frame holds."""
    c = _field(ftype, nullable)
    wire = h("80 80 80 80 08 07 00")
    with pytest.raises(DecodeError) as ei:
        c.decode(wire, 0)
    assert ei.value.path == "F" and "non-nullable" not in ei.value.reason
    with pytest.raises(DecodeError):
        c.top_level_tags(wire, 0)


def test_produce_acks_skip_reads_a_huge_compact_transactional_id_as_null():
    """The proxy's Produce ``Acks`` skip plan walks the nullable compact
    TransactionalId as Kafka reads it."""
    import struct

    from kinspect.codec import Codec
    from kinspect.proxy.tracker import _skip, _skip_plan

    codec = Codec()
    spec = codec.registry.request(0)
    plan = _skip_plan(spec, 9, "Acks")
    buf = h("81 80 80 80 08") + struct.pack(">h", -1)
    pos = _skip(tuple(plan), buf)
    assert pos == 5 and struct.unpack_from(">h", buf, pos)[0] == -1
    assert codec.registry.codec(spec).peek_field(buf + bytes(20), 9, 0, "Acks") == -1


# ---------------------------------------------------------------------------
# tagged strings and bytes are compact: a tagged field's versions are flexible ones


def test_tagged_field_outside_its_own_flexible_versions_is_a_spec_error():
    """MessageDataGenerator.generateClassReader: "Field S specifies tagged versions 0+
    that are not a subset of the flexible versions none" (the field's own
    flexibleVersions when it has them, else the message's)."""
    for own in ("none", "1+"):
        with pytest.raises(SpecError) as ei:
            inline({"name": "T", "type": "data", "validVersions": "0-1", "flexibleVersions": "0+",
                    "fields": [{"name": "S", "type": "string", "versions": "0+",
                                "flexibleVersions": own, "taggedVersions": "0+", "tag": 0}]})
        assert ei.value.field == "S" and "non-flexible" in ei.value.reason


def test_tagged_string_with_a_narrower_flexible_versions_is_compact_where_tagged():
    """A field-level flexibleVersions "1+" in a message flexible from 0: at v0 the
    string is untagged and not compact (int16 length); from v1 it is tagged, and
    compact (writeUnsignedVarint(tag), the size, writeUnsignedVarint(len + 1), the
    bytes)."""
    c = inline({"name": "T", "type": "data", "validVersions": "0-1", "flexibleVersions": "0+",
                "fields": [{"name": "S", "type": "string", "versions": "0+",
                            "flexibleVersions": "1+", "taggedVersions": "1+", "tag": 0}]})
    m = c.cls(S="ab")
    v0 = h("00 02 61 62 | 00")  # int16 length 2, "ab", an empty tag section
    v1 = h("01 | 00 03 03 61 62")  # one tag: tag 0, 3 bytes: length 2 + 1, "ab"
    assert c.encode(m, 0) == v0 and c.decode(v0, 0) == m
    assert c.encode(m, 1) == v1 and c.decode(v1, 1) == m


def test_field_flexible_versions_beyond_the_messages_are_a_spec_error():
    """MessageDataGenerator.fieldFlexibleVersions: "The flexible versions for field
    ... are not a subset of the flexible versions for the message as a whole"."""
    with pytest.raises(SpecError) as ei:
        inline({"name": "T", "type": "data", "validVersions": "0-2", "flexibleVersions": "2+",
                "fields": [{"name": "S", "type": "string", "versions": "0+",
                            "flexibleVersions": "1+"}]})
    assert ei.value.field == "S" and "subset" in ei.value.reason


# ---------------------------------------------------------------------------
# wrong types are EncodeErrors in every encoder

PRIMS = {
    "name": "P", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "Bo", "type": "bool", "versions": "0+"},
        {"name": "I8", "type": "int8", "versions": "0+"},
        {"name": "I32", "type": "int32", "versions": "0+"},
        {"name": "U32", "type": "uint32", "versions": "0+"},
        {"name": "F", "type": "float64", "versions": "0+"},
        {"name": "Ints", "type": "[]int32", "versions": "0+"},
        {"name": "Bools", "type": "[]bool", "versions": "0+"},
        {"name": "Strs", "type": "[]string", "versions": "0+"},
        {"name": "Sub", "type": "Sub", "versions": "0+",
         "fields": [{"name": "V", "type": "int16", "versions": "0+"}]},
        {"name": "Subs", "type": "[]Sub2", "versions": "0+",
         "fields": [{"name": "W", "type": "int64", "versions": "0+"}]},
        {"name": "TI", "type": "int32", "versions": "1+", "taggedVersions": "1+", "tag": 0},
    ],
}


@pytest.mark.parametrize("field,value", [
    ("Bo", 2), ("Bo", 1), ("Bo", 0), ("I8", True), ("I32", False), ("U32", True),
    ("I32", 1.0), ("F", True), ("F", "1"), ("Ints", [1, True]), ("Bools", [True, 1]),
    ("Ints", (1, 2.0)), ("Strs", "abc"), ("Ints", b"\x01\x02"), ("Strs", {"a": 1}),
    ("TI", True),
])
@pytest.mark.parametrize("version", [0, 1])
def test_values_of_the_wrong_type_are_encode_errors_naming_the_field(field, value, version):
    c = inline(PRIMS)
    if field == "TI" and version == 0:  # a field v0 does not have: any non-default value
        with pytest.raises(EncodeError, match=r"\bTI\b.*version 0 does not have"):
            c.encode(c.cls(**{field: value}), version)
        return
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(**{field: value}), version)
    assert ei.value.path is not None and ei.value.path.split(".")[1].startswith(field), ei.value


@pytest.mark.parametrize("version", [0, 1])
def test_structs_of_another_class_are_encode_errors(version):
    c = inline(PRIMS)
    other = inline(PRIMS)  # same spec, another class
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(Sub=other.cls().Sub), version)
    assert ei.value.path == "P.Sub"
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(Subs=[c.cls().Sub]), version)
    assert ei.value.path.startswith("P.Subs")


class _Code(enum.IntEnum):
    TWO = 2


@pytest.mark.parametrize("version", [0, 1])
def test_int_subclasses_tuples_and_ints_for_floats_encode_like_their_plain_values(version):
    """What the rules allow but the fast encoder does not check exactly is encoded
    all the same (by the traced encoder), to the same bytes."""
    c = inline(PRIMS)
    tagged = version == 1  # TI exists from version 1
    plain = c.cls(I8=2, I32=2, Ints=[2, 3], F=2.0, **({"TI": 2} if tagged else {}))
    odd = c.cls(I8=_Code.TWO, I32=_Code.TWO, Ints=(_Code.TWO, 3), F=2,
                **({"TI": _Code.TWO} if tagged else {}))
    assert c.encode(odd, version) == c.encode(plain, version)


# ---------------------------------------------------------------------------
# from_dict


@pytest.mark.parametrize("bad", [
    ["00"], "00", 5, {"x": "00"}, {"-1": "00"}, {"1.5": "00"}, {"": "00"},
    {"4294967296": "00"}, {"1": "zz"}, {"1": "0"}, {"1": 5}, {"1": None},
    {"1": "00", "01": "00"}, {"١": "00"},
])
def test_malformed_unknown_tags_are_encode_errors(bad):
    c = inline(PRIMS)
    with pytest.raises(EncodeError) as ei:
        c.cls.from_dict({"_unknown_tags": bad})
    assert "_unknown_tags" in str(ei.value)


def test_unknown_tags_round_trip_through_dicts():
    c = inline(PRIMS)
    m = c.cls.from_dict({"_unknown_tags": {"7": "0102", "4294967295": ""}, "I8": 1})
    assert m.unknown_tags == {7: b"\x01\x02", 4294967295: b""}
    assert c.cls.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert c.cls.from_dict({"_unknown_tags": None}).unknown_tags == {}
