"""The C fast path of the decoder (kinspect/codec/_native.c) against the generated
Python decoder it stands in for, and its scan against the generated Python scanner.

Contract: on any input, the C decoder either returns exactly what the generated
Python decoder returns (same classes, field values and their types, unknown tags,
present-default marks, end offset) or declines (None), and it declines exactly
where the Python decoder fails. Checked on hypothesis-generated values of every
message version of Kafka's corpus and kafka-python's set, with unknown tagged
fields at every level, on mutated bodies of those, and on hand-built edge cases
(custom defaults, encodings, nullable structs, deep nesting, huge counts).
"""

from __future__ import annotations

import gc
import os
import random
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest
from codec_util import corpus_registry, h, inline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import message_values

from kinspect.codec import DecodeError, SpecRegistry, Struct
from kinspect.codec.native import native_module
from kinspect.codec.registry import _DECODE_FAILURES as DECODE_FAILURES
from kinspect.codec.registry import kafka_python_specs
from kinspect.codec.scan import compile_scanner
from kinspect.codec import spec as spec_mod

NATIVE = native_module()
REG = corpus_registry()
_KP_DIR = kafka_python_specs()
KP = SpecRegistry.load([str(_KP_DIR)], use_env=False, use_project=False, use_default=False) \
    if _KP_DIR else None

_CFG = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
_EXAMPLES = int(os.environ.get("KINSPECT_FUZZ_EXAMPLES", "300"))


def test_native_extension_is_built():
    """The C fast path is part of the build; a missing one must not pass silently
    as 'slow but working'. KINSPECT_NATIVE=0 says running without it is meant."""
    if os.environ.get("KINSPECT_NATIVE", "").strip() == "0":
        assert NATIVE is None
        return
    assert NATIVE is not None, (
        "kinspect.codec._native is not built: install with a C compiler and the Python "
        "headers (`pip install -e .`), or set KINSPECT_NATIVE=0 to test the Python path alone")


def test_a_stale_build_is_refused(monkeypatch, caplog):
    """An extension built from an older _native.c (an editable install not rebuilt)
    is not used: a warning says to rebuild, or with KINSPECT_NATIVE=1 an error."""
    if NATIVE is None:
        pytest.skip("the extension is off (KINSPECT_NATIVE=0)")
    monkeypatch.setattr(NATIVE, "ABI", -1)
    monkeypatch.delenv("KINSPECT_NATIVE", raising=False)
    with caplog.at_level("WARNING", logger="kinspect.codec"):
        assert native_module() is None
    assert "pip install -e ." in caplog.text
    monkeypatch.setenv("KINSPECT_NATIVE", "1")
    with pytest.raises(ImportError, match="rebuild"):
        native_module()


needs_native = pytest.mark.skipif(
    NATIVE is None and os.environ.get("KINSPECT_NATIVE", "").strip() == "0",
    reason="KINSPECT_NATIVE=0: the C fast path is off on purpose")


def test_python_decoder_alone_passes_the_codec_suites():
    """Without the C fast path (no compiler at install time, or KINSPECT_NATIVE=0)
    the generated Python decoder and scanner do all the work: the conformance,
    fidelity and safety suites pass on them alone (run in a child process with the
    C path off)."""
    import subprocess

    env = dict(os.environ, KINSPECT_NATIVE="0")
    tests = Path(__file__).resolve().parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(tests / "test_conformance.py"), str(tests / "test_codec_fidelity.py"),
         str(tests / "test_codec_safety.py"), str(tests / "test_codec_native.py"),
         "-k", "not test_python_decoder_alone"],
        cwd=tests.parent, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail


def same_tree(a, b, path: str = "$") -> None:
    """``a`` and ``b`` are identical decoded trees: same types all the way down
    (``True`` is not ``1``), same field values, unknown tags and present marks."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Struct):
        for name in a._fields:
            same_tree(getattr(a, name), getattr(b, name), f"{path}.{name}")
        assert a._unknown == b._unknown, f"{path}: unknown tags {a._unknown!r} != {b._unknown!r}"
        assert getattr(a, "_present", None) == getattr(b, "_present", None), f"{path}: present"
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} elements"
        for i, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: NaN != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def both(codec, buf: bytes, version: int, pos: int = 0, end: int | None = None):
    """(native result, Python result): each ``(value, end)`` or ``None`` if it failed."""
    end = len(buf) if end is None else end
    cv = codec.compiled(version)
    assert cv.native is not None
    try:
        nat = NATIVE.decode(cv.native, buf, pos, end)
    except DECODE_FAILURES:  # raised by a Python tag-section function: declined
        nat = None
    try:
        # as MessageCodec.decode_from calls it: with a buffer that ends at `end`
        py = cv.decode(buf[:end] if end < len(buf) else buf, pos, end)
    except DECODE_FAILURES:  # how the generated decoder fails
        py = None
    return nat, py


_PY_SCANNERS: dict = {}


def python_scan(codec, buf: bytes, version: int, pos: int, end: int):
    """The generated Python scanner's ``(end, tags)``, or None if it failed."""
    key = (id(codec), version)
    # the entry keeps its codec alive: a codec made later cannot reuse its id and be
    # handed another spec's scanner
    if key not in _PY_SCANNERS:
        _PY_SCANNERS[key] = (codec, compile_scanner(codec.spec, version))
    try:
        return _PY_SCANNERS[key][1](buf, pos, end)
    except Exception:  # noqa: BLE001 - any failure of the generated scanner
        return None


def agree(codec, buf: bytes, version: int, pos: int = 0, end: int | None = None) -> bool:
    end = len(buf) if end is None else end
    nat, py = both(codec, buf, version, pos, end)
    assert (nat is None) == (py is None), (
        f"{codec.api} v{version}: native {'declined' if nat is None else 'accepted'}, "
        f"Python {'failed' if py is None else 'decoded'}: {buf[pos:end].hex()}")
    if nat is not None:
        assert nat[1] == py[1], f"end {nat[1]} != {py[1]}"
        same_tree(nat[0], py[0])
    # the C scan walks whatever decodes, to the same end, and finds the tags the
    # Python scanner finds
    sc = NATIVE.scan(codec.compiled(version).native, buf, pos, end)
    if nat is not None:
        assert sc is not None and sc[0] == nat[1], (sc, nat[1])
    pys = python_scan(codec, buf, version, pos, end)
    if nat is not None:
        assert pys is not None and pys[0] == sc[0] and sorted(pys[1]) == sorted(sc[1])
    return nat is not None


def _pairs(reg: SpecRegistry | None, tag: str) -> list:
    if reg is None:
        return []
    return [pytest.param(reg, name, v, id=f"{tag}-{name}-v{v}")
            for name in sorted(reg.messages)
            for v in range(reg.messages[name].valid_versions.lowest,
                           reg.messages[name].valid_versions.highest + 1)]


PAIRS = _pairs(REG, "kafka") + _pairs(KP, "kafka-python")


def _values_test(reg, name: str, version: int, n: int) -> None:
    codec = reg.codec(name)

    @settings(max_examples=n, **_CFG)
    @given(message_values(codec.spec, version), st.randoms(use_true_random=False))
    def check(value, rnd):
        raw = codec.encode(value, version)
        assert agree(codec, raw, version)
        # the same bytes inside a larger buffer: offsets are relative to it, and
        # nothing after `end` is read
        pre = bytes(rnd.randrange(256) for _ in range(rnd.randrange(4)))
        post = bytes(rnd.randrange(256) for _ in range(rnd.randrange(4)))
        big = pre + raw + post
        nat, _ = both(codec, big, version, len(pre), len(pre) + len(raw))
        assert nat is not None and nat[1] == len(pre) + len(raw)
        same_tree(nat[0], codec.compiled(version).decode(raw, 0, len(raw))[0])
        # every truncation is declined, as the Python decoder fails on it
        for cut in sorted({0, len(raw) // 2, len(raw) - 1} - {len(raw)}):
            if cut >= 0:
                agree(codec, raw[:cut], version)

    check()


@needs_native
@pytest.mark.parametrize("reg,name,version", PAIRS)
def test_generated_values_decode_identically(reg, name, version):
    _values_test(reg, name, version, 3)


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("reg,name,version", PAIRS)
def test_generated_values_decode_identically_long(reg, name, version):
    _values_test(reg, name, version, 40)


@st.composite
def mutated_bodies(draw):
    reg = draw(st.sampled_from([r for r in (REG, KP) if r is not None]))
    name = draw(st.sampled_from(sorted(reg.messages)))
    spec = reg.messages[name]
    version = draw(st.integers(spec.valid_versions.lowest, spec.valid_versions.highest))
    raw = bytearray(reg.codec(name).encode(draw(message_values(spec, version)), version))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    for _ in range(rnd.randint(1, 4)):
        if not raw:
            break
        i = rnd.randrange(len(raw))
        op = rnd.choice(["flip", "set", "insert", "delete", "truncate", "huge", "varint"])
        if op == "flip":
            raw[i] ^= 1 << rnd.randrange(8)
        elif op == "set":
            raw[i] = rnd.randrange(256)
        elif op == "insert":
            raw[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif op == "delete":
            del raw[i:i + rnd.randint(1, 8)]
        elif op == "truncate":
            del raw[i:]
        elif op == "huge":
            raw[i:i + 4] = rnd.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe",
                                       b"\x80\x00\x00\x00", b"\x00\x00\xff\xff"])
        else:
            raw[i:i + 1] = rnd.choice([b"\xff\xff\xff\xff\x0f", b"\x80" * 6,
                                       b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
    return reg.codec(name), bytes(raw), version


@needs_native
@settings(max_examples=_EXAMPLES, **_CFG)
@given(mutated_bodies())
def test_mutated_bodies_accepted_or_declined_alike(case):
    agree(*case)


@pytest.mark.slow
@needs_native
@settings(max_examples=20000, **_CFG)
@given(mutated_bodies())
def test_mutated_bodies_accepted_or_declined_alike_long(case):
    agree(*case)


# -- hand-built edge cases ---------------------------------------------------------

EDGE = {
    "apiKey": 900, "type": "response", "name": "EdgeResponse", "validVersions": "0-2",
    "flexibleVersions": "1+",
    "fields": [
        {"name": "B", "type": "bool", "versions": "0+"},
        {"name": "I8", "type": "int8", "versions": "0+", "default": "-3"},
        {"name": "U16", "type": "uint16", "versions": "0+"},
        {"name": "U32", "type": "uint32", "versions": "0+"},
        {"name": "I64", "type": "int64", "versions": "0+", "default": "0x7f"},
        {"name": "F", "type": "float64", "versions": "0+", "default": "1.5"},
        {"name": "Id", "type": "uuid", "versions": "0+"},
        {"name": "P16", "type": "int16", "versions": "0+", "encoding": "packed16"},
        {"name": "P64", "type": "int64", "versions": "0+", "encoding": "packed64"},
        {"name": "U32v", "type": "int32", "versions": "0+", "encoding": {"0": "fixed32", "1+": "upacked32"}},
        {"name": "S", "type": "string", "versions": "0+", "nullableVersions": "0+"},
        {"name": "Old", "type": "string", "versions": "0", "flexibleVersions": "none",
         "default": "gone"},
        {"name": "NoFlex", "type": "string", "versions": "0+", "flexibleVersions": "none"},
        {"name": "Bs", "type": "bytes", "versions": "0+", "nullableVersions": "1+"},
        {"name": "Ids", "type": "[]uuid", "versions": "0+"},
        {"name": "Strs", "type": "[]string", "versions": "0+", "nullableVersions": "2+"},
        {"name": "Bools", "type": "[]bool", "versions": "0+"},
        {"name": "Ns", "type": "Inner", "versions": "2+", "nullableVersions": "2+",
         "fields": [{"name": "X", "type": "int32", "versions": "0+", "default": "5"},
                    {"name": "Y", "type": "[]int64", "versions": "0+"}]},
        {"name": "Absent", "type": "Inner2", "versions": "5+",
         "fields": [{"name": "Z", "type": "string", "versions": "0+", "default": "z"},
                    {"name": "W", "type": "[]int8", "versions": "0+", "default": "null",
                     "nullableVersions": "0+"}]},
        {"name": "Tagged", "type": "Inner3", "versions": "1+", "taggedVersions": "1+", "tag": 0,
         "fields": [{"name": "Q", "type": "int16", "versions": "0+", "default": "-1"}]},
        {"name": "TagInt", "type": "int32", "versions": "1+", "taggedVersions": "1+", "tag": 1,
         "default": "017"},
    ],
}


@needs_native
@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_field_kind_decodes_identically(version):
    codec = inline(EDGE)
    cls = codec.cls
    st_ = codec.spec.struct
    inner = st_.field("Ns").struct.cls
    tagged = st_.field("Tagged").struct.cls
    value = cls(B=True, I8=-128, U16=65535, U32=2**32 - 1, I64=-2**63, F=float("-inf"),
                Id=bytes(range(16)), P16=-32768, P64=2**63 - 1, U32v=2**31 - 1, S="ünï",
                NoFlex="x" * 200, Bs=b"\x00" * 300, Ids=[bytes(16), b"\xff" * 16],
                Strs=["a", "", "é" * 70], Bools=[True, False, True],
                Ns=inner(X=-1, Y=[1, -2**63]) if version >= 2 else inner(),
                Tagged=tagged(Q=7) if version else tagged(), TagInt=99 if version else 15)
    raw = codec.encode(value, version)
    assert agree(codec, raw, version)
    got = codec.decode(raw, version)
    assert got == value
    assert got.Old == "gone" and got.Absent.Z == "z" and got.Absent.W is None
    assert got.TagInt == (99 if version else 0o17)  # "017": Java-style octal default
    if version >= 2:  # KIP-893: a null nullable struct
        value.Ns = None
        raw = codec.encode(value, version)
        assert agree(codec, raw, version) and codec.decode(raw, version).Ns is None
    # defaults are fresh objects per decode, never shared between values
    a, b = codec.decode(raw, version), codec.decode(raw, version)
    assert a.Absent is not b.Absent
    a.Absent.Z = "changed"
    assert b.Absent.Z == "z"


@needs_native
@pytest.mark.parametrize("inner, ok", [
    ((36, 8, 0), True),     # 44 elements that take no bytes in a 44-byte frame
    ((36, 9, 0), False),    # one more
    ((0, 0, 0), True),
    ((36, 32, 28), False),  # each count claims every byte left (nested: L**2/8)
])
def test_elements_that_take_no_bytes_are_counted_alike(inner, ok):
    """The C path and the Python decoder count elements that take no bytes against the
    frame's length alike, and the scanners walk what decodes (test_codec_safety)."""
    codec = inline({"name": "Z", "type": "data", "validVersions": "0-1",
                    "flexibleVersions": "none", "fields": [
                        {"name": "Outer", "type": "[]O", "versions": "0+", "fields": [
                            {"name": "Inner", "type": "[]E", "versions": "0+", "fields": [
                                {"name": "V", "type": "int8", "versions": "1+"}]}]}]})
    counts = (*inner, *[0] * (10 - len(inner)))
    frame = struct.pack(">11i", 10, *counts)
    assert agree(codec, frame, 0) is ok
    if ok:
        assert [len(o.Inner) for o in codec.decode(frame, 0).Outer] == list(counts)


def _nulls(nullable: bool):
    nv = {"nullableVersions": "0+"} if nullable else {}
    return inline({"name": "N", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
                   "fields": [
                       {"name": "S", "type": "string", "versions": "0+", **nv},
                       {"name": "B", "type": "bytes", "versions": "0+", **nv},
                       {"name": "A", "type": "[]int32", "versions": "0+", **nv},
                       {"name": "AS", "type": "[]E", "versions": "0+", **nv, "fields": [
                           {"name": "V", "type": "int8", "versions": "0+"}]},
                       {"name": "NS", "type": "Inner", "versions": "0+", **nv, "fields": [
                           {"name": "X", "type": "int8", "versions": "0+"}]},
                       {"name": "T", "type": "int8", "versions": "0+"}]})


@needs_native
@pytest.mark.parametrize("marker,null", [("ff", True), ("80", True), ("fe", True),
                                         ("00", False), ("01", False), ("02", False),
                                         ("7f", False)])
def test_negative_lengths_and_struct_markers_read_alike(marker, null):
    """Any negative length of a nullable field is null; a nullable struct's int8
    marker is null when negative and present otherwise (Kafka's generated readers):
    the C decoder, the Python decoder and both scans agree. In non-nullable fields a
    negative length is declined and a DecodeError."""
    wire = bytes.fromhex("fffe" + "80000000" + "fffffff0" + "ffffff00" + marker
                         + ("" if null else "07") + "09")
    codec = _nulls(True)
    assert agree(codec, wire, 0)
    m = codec.decode(wire, 0)
    assert (m.S, m.B, m.A, m.AS, m.T) == (None, None, None, None, 9)
    assert (m.NS is None) if null else m.NS.X == 7
    strict = _nulls(False)
    assert not agree(strict, wire, 0)
    with pytest.raises(DecodeError) as ei:
        strict.decode(wire, 0)
    assert ei.value.path == "S" and ei.value.offset == 0


TAGS = {"name": "G", "type": "data", "validVersions": "1-2", "flexibleVersions": "1+",
        "fields": [{"name": "A", "type": "int32", "versions": "0+"},
                   {"name": "T1", "type": "int32", "versions": "1+", "taggedVersions": "1+",
                    "tag": 1},
                   {"name": "T5", "type": "int32", "versions": "2+", "taggedVersions": "2+",
                    "tag": 5},
                   {"name": "E", "type": "[]El", "versions": "0+", "fields": [
                       {"name": "B", "type": "int8", "versions": "0+"},
                       {"name": "T3", "type": "int8", "versions": "2+",
                        "taggedVersions": "2+", "tag": 3}]}]}


@needs_native
@pytest.mark.parametrize("version,elem_tags,top_tags,ok", [
    (1, "00", "02 09 01 aa 01 04 00 00 00 03", True),   # any order
    (1, "02 07 00 06 00", "00", True),                     # any order, nested
    (1, "00", "02 09 01 aa 09 01 bb", False),              # repeated unknown tag
    (1, "00", "03 01 04 00 00 00 03 09 00 01 04 00 00 00 04", False),  # repeated known tag
    (1, "03 07 00 06 00 07 01 01", "00", False),           # repeated, nested, not adjacent
    (1, "00", "01 05 04 00 00 00 07", False),              # tag 5 is not valid at v1
    (2, "00", "01 05 04 00 00 00 07", True),
    (1, "01 03 01 01", "00", False),                       # nested tag 3 is not valid at v1
    (2, "01 03 01 01", "00", True),
])
def test_tag_sections_are_judged_alike(version, elem_tags, top_tags, ok):
    """Tags in any order are accepted, a tag repeated in one section or a known tag
    outside its taggedVersions is not: by the C path (decode and scan), the
    generated Python decoder and the Python scanner alike."""
    codec = inline(TAGS)
    wire = h("00 00 00 01 | 03 | 01 | " + elem_tags + "| 02 | 00 |" + top_tags)
    assert agree(codec, wire, version) is ok
    end = len(wire)
    scans = (NATIVE.scan(codec.compiled(version).native, wire, 0, end),
             python_scan(codec, wire, version, 0, end))
    assert all((sc is not None and sc[0] == end) is ok for sc in scans), scans
    if not ok:
        with pytest.raises(DecodeError, match="repeated|not valid for version"):
            codec.decode(wire, version)
        with pytest.raises(DecodeError, match="repeated|not valid for version"):
            codec.top_level_tags(wire, version)


@needs_native
def test_many_tags_out_of_order_scan_in_bounded_time_and_memory():
    """A section of 20000 distinct unknown tags in descending order, then the same
    with one repeated: the C scan's repeat check sorts (no quadratic walk)."""
    codec = inline(TAGS)
    n = 20000
    body = bytearray()
    for t in range(n + 100, 100, -1):
        body += _uv(t) + b"\x00"
    head = h("00 00 00 01 | 01 |") + _uv(n)
    wire = head + bytes(body)
    native = codec.compiled(1).native
    got = NATIVE.scan(native, wire, 0, len(wire))
    assert got is not None and got[0] == len(wire) and len(got[1]) == n
    rep = head + bytes(body[:-4]) + _uv(n + 100) + b"\x00"
    assert NATIVE.scan(native, rep, 0, len(rep)) is None
    assert python_scan(codec, rep, 1, 0, len(rep)) is None


def _uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@needs_native
def test_long_compact_strings_are_declined_like_the_python_decoder():
    """A compact string (field or array element) of 32768 bytes is refused by every
    reader, 32767 accepted (Kafka's limit)."""
    codec = inline({"name": "L", "type": "data", "validVersions": "0", "flexibleVersions": "0+",
                    "fields": [{"name": "S", "type": "string", "versions": "0+"},
                               {"name": "A", "type": "[]string", "versions": "0+"}]})
    for n, ok in ((32767, True), (32768, False)):
        s = _uv(n + 1) + b"a" * n
        for wire in (s + b"\x01\x00", b"\x01\x02" + s + b"\x00"):
            assert agree(codec, wire, 0) is ok
            sc = NATIVE.scan(codec.compiled(0).native, wire, 0, len(wire))
            assert (sc is not None) is ok
            assert (python_scan(codec, wire, 0, 0, len(wire)) is not None) is ok


@needs_native
def test_present_default_tags_are_marked_like_the_python_decoder():
    """A tagged field sent with its default value is remembered as present, so it is
    re-encoded (lossless); the C path hands tag sections to the generated function."""
    codec = inline(EDGE)
    value = codec.cls(TagInt=15)
    value._present = frozenset({1})
    raw = codec.encode(value, 1)
    assert agree(codec, raw, 1)
    back = codec.decode(raw, 1)
    assert back._present == frozenset({1}) and codec.encode(back, 1) == raw


@needs_native
def test_huge_counts_are_declined_before_allocating():
    codec = REG.codec("MetadataResponse")
    for version in (1, 12):
        # Brokers count claims 2**31-1 elements in a tiny buffer (compact: uvarint
        # 2**31, Integer.MIN_VALUE - 1 in Java's int arithmetic)
        body = (struct.pack(">i", 0) if version >= 3 else b"") + (
            b"\x80\x80\x80\x80\x08" if version >= 9 else b"\x7f\xff\xff\xff") + b"\x00" * 8
        codec.compiled(version)  # compiled before measuring
        tracemalloc.start()
        try:
            nat, py = both(codec, body, version)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert nat is None and py is None
        assert peak < 1 << 20, peak
        with pytest.raises(DecodeError):
            codec.decode(body, version)


@needs_native
def test_counts_the_bytes_do_not_back_allocate_nothing():
    """A 8 MiB frame whose broker array claims 8 million elements: the first element
    is invalid, and the list is grown as elements are read, so nothing near
    8 M pointers is allocated before the decoder gives up."""
    codec = REG.codec("MetadataResponse")
    size = 8 << 20
    body = struct.pack(">i", 0) + b"\xf0\xff\xff\x03"  # ThrottleTimeMs, count ~8.4 M
    body += b"\x00" * (size - len(body))  # broker 0: NodeId 0, Host null (not nullable)
    codec.compiled(12)  # compiled before measuring
    tracemalloc.start()
    try:
        nat, py = both(codec, body, 12)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert nat is None and py is None
    assert peak < 1 << 20, peak


@needs_native
def test_bad_utf8_decodes_alike_and_bad_lengths_are_reported_precisely():
    """Invalid UTF-8 decodes in both decoders (lone surrogates, as Kafka's reader
    takes such a string rather than failing); a non-nullable string's null is
    declined by the C path and reported precisely."""
    codec = inline(EDGE)
    raw = bytearray(codec.encode(codec.cls(S="abc"), 0))
    i = raw.index(b"abc")
    raw[i] = 0xff
    assert agree(codec, bytes(raw), 0)
    assert codec.decode(bytes(raw), 0).S == "\udcffbc"
    raw = bytearray(codec.encode(codec.cls(NoFlex="abc"), 0))
    i = raw.index(b"\x00\x03abc")
    raw[i:i + 2] = b"\xff\xff"
    assert not agree(codec, bytes(raw), 0)
    with pytest.raises(DecodeError) as e:
        codec.decode(bytes(raw), 0)
    assert e.value.path and e.value.path.endswith("NoFlex") and e.value.offset == i


@needs_native
def test_deep_nesting_is_declined_not_a_crash(monkeypatch):
    """A custom spec nested 70 structs deep: the C path stops at its depth limit (64) and
    leaves the value to the Python decoder. Specs that deep are refused at load
    (``MAX_STRUCT_DEPTH``); the limit is lifted here to reach the C path's own guard."""
    monkeypatch.setattr(spec_mod, "MAX_STRUCT_DEPTH", 100)
    fields: list = [{"name": "V", "type": "int8", "versions": "0+"}]
    for i in range(70):
        fields = [{"name": f"S{i}", "type": f"Level{i}", "versions": "0+", "fields": fields}]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # json5's parser recurses per nesting level
    try:
        codec = inline({"type": "data", "name": "Deep", "validVersions": "0",
                        "flexibleVersions": "none", "fields": fields})
    finally:
        sys.setrecursionlimit(limit)
    raw = codec.encode(codec.cls(), 0)
    assert raw == b"\x00"
    cv = codec.compiled(0)
    assert NATIVE.decode(cv.native, raw, 0, len(raw)) is None
    assert codec.decode(raw, 0) == codec.cls()


@needs_native
def test_deep_default_structs_are_declined_not_a_recursion_error(monkeypatch):
    """The same nesting as a default (the outer struct absent in v0): the C path
    declines, the Python decoder builds it (the spec limit lifted as above)."""
    monkeypatch.setattr(spec_mod, "MAX_STRUCT_DEPTH", 100)
    fields: list = [{"name": "V", "type": "int8", "versions": "0+"}]
    for i in range(70):
        fields = [{"name": f"S{i}", "type": f"Level{i}", "versions": "1+" if i == 69 else "0+",
                   "fields": fields}]
    fields.append({"name": "X", "type": "int8", "versions": "0+"})
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        codec = inline({"type": "data", "name": "DeepDefault", "validVersions": "0-1",
                        "flexibleVersions": "none", "fields": fields})
    finally:
        sys.setrecursionlimit(limit)
    cv = codec.compiled(0)
    assert NATIVE.decode(cv.native, b"\x05", 0, 1) is None
    assert codec.decode(b"\x05", 0).X == 5
    with pytest.raises(RecursionError):
        NATIVE.default(cv.native)


@needs_native
def test_programs_reject_bad_set_up():
    """Programs are built by the compiler; anything else is refused, not trusted."""
    codec = inline(EDGE)
    cls = codec.cls
    with pytest.raises(AttributeError):
        NATIVE.Program(int)  # no _unknown slot
    pg = NATIVE.Program(cls)
    with pytest.raises(ValueError):
        NATIVE.decode(pg, b"", 0, 0)  # not set up
    with pytest.raises(AttributeError):
        pg.setup([(NATIVE.K_FIXED, "Nope", NATIVE.T_I8, 0, 0, 0, None, None)], [], False, None)
    with pytest.raises(ValueError):
        pg.setup([(NATIVE.K_FIXED, "B", 99, 0, 0, 0, None, None)], [], False, None)
    with pytest.raises(ValueError):  # reading ops are not defaults
        pg.setup([], [(NATIVE.K_FIXED, "B", NATIVE.T_I8, 0, 0, 0, None, None)], False, None)
    with pytest.raises(TypeError):
        pg.setup([], [], True, None)  # flexible without a tag-section function
    pg.setup([(NATIVE.K_FIXED, "B", NATIVE.T_BOOL, 0, 0, 0, None, None)], [], False, None)
    with pytest.raises(ValueError):
        pg.setup([], [], False, None)  # once
    v, end = NATIVE.decode(pg, b"\x02", 0, 1)
    assert v.B is True and end == 1 and v.unknown_tags == {}
    assert NATIVE.decode(pg, b"\x02", 1, 1) is None
    assert NATIVE.decode(pg, b"\x02", 0, 5) is None  # end past the buffer
    # what the ops borrow is held immutably: nothing reachable can pull it away
    assert not [r for r in gc.get_referents(pg) if isinstance(r, (list, dict))]


@needs_native
def test_no_half_built_list_is_visible_to_python_code():
    """A tag-section function (Python) runs in the middle of an array; a heap walker
    there sees only whole lists (a list with missing items would crash it)."""
    codec = inline(EDGE)
    inner_cls = codec.spec.struct.field("Ns").struct.cls
    seen = []

    def walker(o, buf, pos, end, cnt):
        o._unknown = None
        for obj in gc.get_objects():
            if type(obj) is list and obj and type(obj[0]) is inner_cls:
                seen.append(sum(1 for _ in obj))
        return pos

    inner = NATIVE.Program(inner_cls)
    inner.setup([(NATIVE.K_FIXED, "X", NATIVE.T_I8, 0, 0, 0, None, None)], [], True, walker)
    outer = NATIVE.Program(codec.cls)
    outer.setup([(NATIVE.K_ARRAY, "Ids", 0, 1, 0, 0, None, inner)], [], True, lambda *a: a[2])
    # 50 elements: X, then a tag count of 1 (the walker consumes nothing)
    buf = bytes([51]) + bytes([7, 1]) * 50 + bytes([0])
    value, end = NATIVE.decode(outer, buf, 0, len(buf))
    assert end == len(buf) and len(value.Ids) == 50 and seen


def _flexible_responses(c):
    """(api_key, version, response header version, body class) of every flexible
    response version of ``c``'s specs but ApiVersions (whose refusals may carry a v0
    body)."""
    from kinspect.codec.values import struct_class

    for api_key in sorted(c.registry.api_keys()):
        spec = c.registry.response(api_key)
        if spec is None or api_key == 18:
            continue
        cls = struct_class(spec.struct)
        for version in range(spec.valid_versions.lowest, spec.valid_versions.highest + 1):
            if spec.is_flexible(version):
                yield api_key, version, c.response_header_version(api_key, version), cls


def test_response_tags_through_cached_c_scans_agree_with_the_layered_path(monkeypatch):
    """``Codec.response_top_level_tags`` (the proxy's KIP-951 check of every Produce
    v10+ and Fetch v16+ response) runs the body's C scan straight when the response
    header has no tags. For every flexible response version of the default specs,
    with and without body tags, it must give what the layered path gives (header
    decoded, then ``MessageCodec.top_level_tags``), and it must leave to that path
    what it does not take: header tags (valid ones, and a repeated one the
    header's decoder refuses), a truncated frame. A byte after the body is not an
    error there (Kafka's parsers do not read it): the tags are the body's."""
    from kinspect.codec import Codec
    from kinspect.codec.protocol import Response
    from kinspect.codec.registry import MessageCodec, _native_scan

    c = Codec()
    layered = MessageCodec.top_level_tags

    def expected(frame, api_key, version, hv):
        _, pos = c.registry.header("ResponseHeader").decode_from(frame, hv, 0)
        return layered(c.registry.codec(c.registry.response(api_key)), frame, version, pos)

    def fast_only(*args, **kw):
        raise AssertionError("the layered path ran")

    checked = 0
    for api_key, version, hv, cls in _flexible_responses(c):
        for body in (cls(), cls(unknown_tags={7: b"t", 900: b""})):
            frame = c.encode_response(Response(api_key, version, 9, hv, None, body, 0,
                                               "", version))
            want = expected(frame, api_key, version, hv)
            if _native_scan is not None:  # the C scan alone answers
                with monkeypatch.context() as m:
                    m.setattr(MessageCodec, "top_level_tags", fast_only)
                    assert c.response_top_level_tags(frame, api_key, version) == want
            assert c.response_top_level_tags(frame, api_key, version) == want
            if hv == 1:  # header tags: the header's decoder decides
                tagged = frame[:4] + b"\x01\x05\x01x" + frame[5:]
                assert c.response_top_level_tags(tagged, api_key, version) == \
                    expected(tagged, api_key, version, hv)
                repeated = frame[:4] + b"\x02\x05\x01x\x05\x01y" + frame[5:]
                with pytest.raises(DecodeError):
                    c.response_top_level_tags(repeated, api_key, version)
            with pytest.raises(DecodeError):  # truncated
                c.response_top_level_tags(frame[:-1], api_key, version)
            assert c.response_top_level_tags(frame + b"\x00", api_key, version) == want
            with pytest.raises(DecodeError):  # where the message must end the buffer
                layered(c.registry.codec(c.registry.response(api_key)), frame + b"\x00",
                        version, 5 if hv == 1 else 4)
            checked += 1
    assert checked > 100


def test_response_tag_scanner_finds_the_tags_of_a_frame_in_a_larger_buffer():
    """``Codec.response_tag_scanner`` hands the proxy the body's C scan and where the
    body starts, to scan a response where it was read (after its size prefix) with
    no copy. For every flexible response version of the default specs, with and
    without body tags, the scan of the frame inside a larger buffer ends at the
    frame's end with the tags the layered path finds; in a window a byte short it
    does not scan, and in one a byte long it ends where the frame does. ApiVersions
    (whose refusals may carry a v0 body) and versions no spec defines get no
    scanner; nothing does without the C extension."""
    from kinspect.codec import Codec
    from kinspect.codec.protocol import Response, scan_tags

    c = Codec()
    if NATIVE is None:  # (KINSPECT_NATIVE=0)
        assert scan_tags is None and c.response_tag_scanner(0, 10) is None
        return
    assert c.response_tag_scanner(18, 3) is None
    assert c.response_tag_scanner(0, 10_000) is None and c.response_tag_scanner(9999, 0) is None
    checked = 0
    for api_key, version, hv, cls in _flexible_responses(c):
        found = c.response_tag_scanner(api_key, version)
        assert found is not None, (api_key, version)
        program, offset = found
        assert offset == (4 if hv == 0 else 5)
        for body in (cls(), cls(unknown_tags={7: b"t", 900: b""})):
            frame = c.encode_response(Response(api_key, version, 9, hv, None, body, 0,
                                               "", version))
            want = c.response_top_level_tags(frame, api_key, version)
            buf = b"\x00\x00\x01\x00" + frame + b"\x00\x07"
            end = 4 + len(frame)
            got = scan_tags(program, buf, 4 + offset, end)
            assert got is not None and got[0] == end and frozenset(got[1]) == want
            # a byte short: the body does not scan; a byte long: it ends before
            assert scan_tags(program, buf, 4 + offset, end - 1) is None
            got = scan_tags(program, buf, 4 + offset, end + 1)
            assert got is not None and got[0] == end, (api_key, version)
            checked += 1
    assert checked > 100
    # versions from request headers, which a client fills with anything: remembered
    # for at most a bounded number of pairs no spec defines
    for version in range(1000, 6000):
        assert c.response_tag_scanner(0, version) is None
    assert len(c._tag_scans) <= 4096 + checked


def test_scan_clear_answers_what_the_scan_would_with_no_objects():
    """``scan_clear`` (the proxy's question before forwarding a response whose
    broker addresses can only sit under some top-level tags, KIP-951) must answer
    what ``scan_tags`` would: ``True`` exactly when the body scans to the window's
    end and none of its top-level tags has its bit in the trigger mask. Checked for
    every flexible response version of the default specs with and without tags
    (known and unknown, under 64 and over), windows a byte short and a byte long, a
    ProduceResponse v10 carrying ``NodeEndpoints`` (tag 0), and arguments it refuses."""
    from kinspect.codec import Codec
    from kinspect.codec.protocol import Response, scan_clear, scan_tags

    if NATIVE is None:  # (KINSPECT_NATIVE=0)
        assert scan_clear is None
        return
    c = Codec()

    def want(program, buf, pos, end, mask):
        got = scan_tags(program, buf, pos, end)
        return (got is not None and got[0] == end
                and not any(t < 64 and mask >> t & 1 for t in got[1]))

    masks = (0, 1, 1 << 7, (1 << 7) | 1, 1 << 63, (1 << 64) - 1)
    checked = 0
    for api_key, version, hv, cls in _flexible_responses(c):
        program, offset = c.response_tag_scanner(api_key, version)
        for body in (cls(), cls(unknown_tags={7: b"t", 900: b""}), cls(unknown_tags={63: b""})):
            frame = c.encode_response(Response(api_key, version, 9, hv, None, body, 0,
                                               "", version))
            buf = b"\x00\x00\x01\x00" + frame + b"\x00\x07"
            end = 4 + len(frame)
            for mask in masks:
                for stop in (end, end - 1, end + 1):
                    assert scan_clear(program, buf, 4 + offset, stop, mask) is \
                        want(program, buf, 4 + offset, stop, mask), (api_key, version, mask)
                assert scan_clear(program, buf, 4 + offset, end, mask) is not \
                    any(t < 64 and mask >> t & 1 for t in body.unknown_tags or ())
            checked += 1
    assert checked > 100
    # a Produce answer naming its new leader's endpoint (KIP-951): clear of every
    # tag but 0
    from kinspect.codec.values import struct_class

    program, offset = c.response_tag_scanner(0, 10)
    spec = c.registry.response(0)
    endpoint = struct_class(spec.struct.field("NodeEndpoints").struct)
    body = struct_class(spec.struct)(
        NodeEndpoints=[endpoint(NodeId=1, Host="broker-1.example", Port=9092)])
    frame = c.encode_response(Response(0, 10, 1, 1, None, body, 0, "", 10))
    assert scan_tags(program, frame, offset, len(frame))[1] == [0]
    assert scan_clear(program, frame, offset, len(frame), 1) is False
    assert scan_clear(program, frame, offset, len(frame), 2) is True
    # the same tag number inside a partition (CurrentLeader, tag 0 too) is not a
    # top-level tag: clear
    topic = spec.struct.field("Responses").struct
    partition = topic.field("PartitionResponses").struct
    leader = struct_class(partition.field("CurrentLeader").struct)
    body = struct_class(spec.struct)(Responses=[struct_class(topic)(
        Name="t", PartitionResponses=[struct_class(partition)(
            Index=0, CurrentLeader=leader(LeaderId=2, LeaderEpoch=5))])])
    frame = c.encode_response(Response(0, 10, 1, 1, None, body, 0, "", 10))
    back = c.decode_response(frame, 0, 10).body
    assert back.Responses[0].PartitionResponses[0].CurrentLeader.LeaderId == 2
    assert scan_tags(program, frame, offset, len(frame))[1] == []
    assert scan_clear(program, frame, offset, len(frame), 1) is True
    # refused: a window outside the buffer is not clear; wrong arguments raise
    assert scan_clear(program, frame, offset, len(frame) + 1, 0) is False
    assert scan_clear(program, frame, -1, len(frame), 0) is False
    with pytest.raises(TypeError):
        scan_clear(program, frame, offset, len(frame))
    with pytest.raises(TypeError):
        scan_clear(program, frame, offset, len(frame), 1.0)
    with pytest.raises(TypeError):
        scan_clear(program, bytearray(frame), offset, len(frame), 0)
    with pytest.raises(OverflowError):
        scan_clear(program, frame, offset, len(frame), -1)
    with pytest.raises(OverflowError):
        scan_clear(program, frame, offset, len(frame), 1 << 64)


PACKED = {
    "name": "PackedData", "type": "data", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "Bo", "type": "bool", "versions": "0+"},
        {"name": "I8", "type": "int8", "versions": "0+"},
        {"name": "I16", "type": "int16", "versions": "0+"},
        {"name": "U16", "type": "uint16", "versions": "0+"},
        {"name": "I32", "type": "int32", "versions": "0+"},
        {"name": "U32", "type": "uint32", "versions": "0+"},
        {"name": "I64", "type": "int64", "versions": "0+"},
        {"name": "F", "type": "float64", "versions": "0+"},
        *({"name": f"A{t}", "type": f"[]{t}", "versions": "0+"}
          for t in ("bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64")),
    ],
}
_EDGES = {"bool": [True, False], "int8": [-128, 127, 0], "int16": [-32768, 32767],
          "uint16": [0, 65535], "int32": [-2**31, 2**31 - 1], "uint32": [0, 2**32 - 1],
          "int64": [-2**63, 2**63 - 1], "float64": [-0.0, 1.5, float("inf"), -1e300]}


@needs_native
@pytest.mark.parametrize("count", [0, 1, 2, 126, 127, 128, 300])
@pytest.mark.parametrize("version", [0, 1])
def test_c_packers_write_what_the_traced_encoder_writes(count, version):
    """_native.pack_run / pack_array (runs of fixed-width fields, arrays of them,
    with their int32 or compact lengths) against the traced encoder, which packs
    with struct and checks with check_value; and out-of-range values still fail."""
    from kinspect.codec import EncodeError

    c = inline(PACKED)
    vals = {}
    for i, (t, edge) in enumerate(_EDGES.items()):
        name = ["Bo", "I8", "I16", "U16", "I32", "U32", "I64", "F"][i]
        vals[name] = edge[count % len(edge)]
        vals[f"A{t}"] = [edge[k % len(edge)] for k in range(count)]
    value = c.cls(**vals)
    cv = c.compiled(version)
    cv.traced(c.spec, version)
    fast, traced = bytearray(), bytearray()
    cv.encode(value, fast)
    cv.encode_traced(value, traced, [])
    assert fast == traced
    assert c.decode(bytes(fast), version) == value
    for field, bad in (("I16", 32768), ("U32", -1), ("Auint32", [2**32]), ("Aint8", [128]), ("Abool", [1])):
        with pytest.raises(EncodeError):
            c.encode(c.cls(**{field: bad}), version)
