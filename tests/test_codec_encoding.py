"""The proposed per-field ``"encoding"`` property: fixedN (big-endian two's
complement, the default), packedN (zig-zag varint) and upackedN (unsigned varint)
for int16/int32/int64 fields, as a string or a map of version ranges."""

from __future__ import annotations

import pytest
from codec_util import h, inline
from hypothesis import given, settings
from hypothesis import strategies as st

from kinspect.codec import DecodeError, EncodeError, SpecError


def _spec(ftype: str, encoding, versions: str = "0+", valid: str = "0-3", flexible: str = "2+"):
    return {"name": "EncData", "type": "data", "validVersions": valid,
            "flexibleVersions": flexible,
            "fields": [{"name": "X", "type": ftype, "versions": versions, "encoding": encoding},
                       {"name": "Y", "type": "int8", "versions": "0+"}]}


# ---------------------------------------------------------------------------
# acceptance and wire forms

@pytest.mark.parametrize("ftype,enc,value,wire", [
    ("int32", "fixed32", -1, "ff ff ff ff"),
    ("int32", "packed32", 0, "00"),
    ("int32", "packed32", -1, "01"),
    ("int32", "packed32", 1, "02"),
    ("int32", "packed32", -64, "7f"),
    ("int32", "packed32", 64, "80 01"),
    ("int32", "packed32", 2**31 - 1, "fe ff ff ff 0f"),
    ("int32", "packed32", -2**31, "ff ff ff ff 0f"),
    ("int32", "upacked32", 0, "00"),
    ("int32", "upacked32", 300, "ac 02"),
    ("int32", "upacked32", 2**31 - 1, "ff ff ff ff 07"),
    ("int16", "packed16", -32768, "ff ff 03"),
    ("int16", "packed16", 32767, "fe ff 03"),
    ("int16", "upacked16", 32767, "ff ff 01"),
    ("int16", "fixed16", -2, "ff fe"),
    ("int64", "packed64", -2**63, "ff ff ff ff ff ff ff ff ff 01"),
    ("int64", "packed64", 2**63 - 1, "fe ff ff ff ff ff ff ff ff 01"),
    ("int64", "upacked64", 2**63 - 1, "ff ff ff ff ff ff ff ff 7f"),
    ("int64", "fixed64", 1, "00 00 00 00 00 00 00 01"),
])
def test_wire_forms(ftype, enc, value, wire):
    c = inline(_spec(ftype, enc))
    assert c.spec.fields[0].encoding_in(0) == enc.rstrip("0123456789")
    m = c.cls(X=value, Y=7)
    raw = c.encode(m, 0)
    assert raw == h(wire + "| 07")
    assert c.decode(raw, 0) == m
    # in a flexible version the same, plus the tag section
    assert c.encode(m, 2) == h(wire + "| 07 | 00")


def test_version_range_map():
    c = inline(_spec("int32", {"0-1": "fixed32", "2+": "packed32"}))
    m = c.cls(X=-1, Y=0)
    assert c.encode(m, 1) == h("ff ff ff ff 00")
    assert c.encode(m, 2) == h("01 00 00")
    assert c.decode(h("01 00 00"), 3) == m


def test_map_only_needs_to_cover_the_fields_versions():
    c = inline(_spec("int64", {"1": "upacked64", "2+": "fixed64"}, versions="1+"))
    m = c.cls(X=5, Y=1)
    assert c.encode(m, 1) == h("05 01")
    assert c.encode(m, 3) == h("00 00 00 00 00 00 00 05 | 01 | 00")
    assert c.encode(c.cls(X=0, Y=1), 0) == h("01")  # X absent at v0


def test_encoding_in_arrays_of_structs_and_tagged_fields():
    c = inline({"name": "E", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
                "fields": [
                    {"name": "A", "type": "[]Item", "versions": "0+", "fields": [
                        {"name": "V", "type": "int64", "versions": "0+", "encoding": "packed64"}]},
                    {"name": "T", "type": "int32", "versions": "1+", "taggedVersions": "1+",
                     "tag": 0, "encoding": "upacked32"}]})
    item = c.spec.fields[0].struct.cls
    m = c.cls(A=[item(V=-3), item(V=3)], T=300)
    raw = c.encode(m, 1)
    assert raw == h("03 | 05 00 | 06 00 | 01 | 00 02 ac 02")
    assert c.decode(raw, 1) == m


# ---------------------------------------------------------------------------
# values that do not fit

@pytest.mark.parametrize("ftype,enc,value", [
    ("int32", "upacked32", -1), ("int16", "upacked16", -5), ("int64", "upacked64", -2**63),
    ("int16", "packed16", 32768), ("int16", "packed16", -32769), ("int32", "packed32", 2**31),
    ("int64", "packed64", 2**63), ("int32", "packed32", "1"), ("int32", "packed32", None),
])
def test_out_of_range_values_are_encode_errors(ftype, enc, value):
    c = inline(_spec(ftype, enc))
    with pytest.raises(EncodeError) as ei:
        c.encode(c.cls(X=value, Y=0), 0)
    assert ei.value.path == "EncData.X"


@pytest.mark.parametrize("ftype,enc,wire,why", [
    ("int16", "packed16", "80 80 04 00", "out of range"),       # zig-zag 65536
    ("int16", "upacked16", "80 80 02 00", "out of range"),      # 32768
    ("int32", "upacked32", "80 80 80 80 08 00", "out of range"),  # 2**31
    ("int32", "packed32", "80 80 80 80 80 01 00", "longer than 5"),
    ("int32", "packed32", "80 80 80 80 10 00", "32 bits"),
    ("int64", "packed64", "80 80 80 80 80 80 80 80 80 80 01 00", "longer than 10"),
    ("int32", "packed32", "80", "truncated"),
])
def test_bad_varints_are_decode_errors(ftype, enc, wire, why):
    c = inline(_spec(ftype, enc))
    with pytest.raises(DecodeError) as ei:
        c.decode(h(wire), 0)
    assert why in ei.value.reason
    assert ei.value.path == "X" and ei.value.offset == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(-2**63, 2**63 - 1), st.sampled_from(["packed64", "fixed64"]),
       st.integers(0, 2**63 - 1), st.integers(-2**15, 2**15 - 1))
def test_random_round_trips(v64, enc, u64, v16):
    c = inline({"name": "R", "type": "data", "validVersions": "0", "flexibleVersions": "none",
                "fields": [
                    {"name": "A", "type": "int64", "versions": "0+", "encoding": enc},
                    {"name": "B", "type": "int64", "versions": "0+", "encoding": "upacked64"},
                    {"name": "C", "type": "int16", "versions": "0+", "encoding": "packed16"},
                    {"name": "D", "type": "int32", "versions": "0+", "encoding": "packed32"}]})
    m = c.cls(A=v64, B=u64, C=v16, D=v16 * 65537 // 2)
    raw = c.encode(m, 0)
    assert c.decode(raw, 0) == m
    assert c.encode(c.decode(raw, 0), 0) == raw


# ---------------------------------------------------------------------------
# validation: load errors name the file and the field

@pytest.mark.parametrize("ftype,enc,why", [
    ("int32", "varint32", "unknown encoding"),
    ("int32", "packed", "unknown encoding"),
    ("int32", "fixed8", "unknown encoding"),
    ("int32", "packed64", "does not match"),
    ("int64", "upacked32", "does not match"),
    ("int16", "fixed32", "does not match"),
    ("int8", "packed8", "only allowed on int16/int32/int64"),
    ("uint16", "packed16", "only allowed"),
    ("uint32", "packed32", "only allowed"),
    ("string", "packed32", "only allowed"),
    ("[]int32", "packed32", "only allowed"),
    ("int32", 32, "must be a string"),
    ("int32", ["packed32"], "string or a non-empty map"),
    ("int32", {}, "string or a non-empty map"),
    ("int32", {"0+": 5}, "must be a string"),
    ("int32", {"0-1": "packed32", "1+": "fixed32"}, "overlap"),
    ("int32", {"0+": "packed32", "2-3": "fixed32"}, "overlap"),
    ("int32", {"0-1": "packed32"}, "do not cover version 2"),
    ("int32", {"1+": "packed32"}, "do not cover version 0"),
    ("int32", {"0": "packed32", "2+": "fixed32"}, "do not cover version 1"),
    ("int32", {"x": "packed32"}, "version range"),
    ("int32", {"3-1": "packed32"}, "version range"),
    ("int32", {"none": "packed32", "0+": "fixed32"}, "empty encoding version range"),
])
def test_invalid_encodings_are_spec_errors(ftype, enc, why):
    with pytest.raises(SpecError) as ei:
        inline(_spec(ftype, enc), source="enc-spec.json")
    err = ei.value
    assert why in err.reason
    assert err.source == "enc-spec.json" and err.field == "X"
    assert "enc-spec.json" in str(err) and "X" in str(err)
