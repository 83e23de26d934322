"""Tests for kinspect.codec.records.

Batches are produced by kafka-python's own record builders (an independent
implementation) and every decoded field is cross-checked against kafka-python's
reader. kafka-python's codecs need python-snappy, lz4, zstandard and xxhash
(magic 0 lz4 with the KAFKA-3160 header checksum) for building the fixtures.
"""

from __future__ import annotations

import gzip
import json
import struct
import tracemalloc
import zlib

import cramjam
import crc32c
import kafka.codec as kafka_codec  # noqa: E402
import lz4.frame  # noqa: E402
import pytest
import xxhash  # noqa: E402,F401 - kafka-python needs it for magic-0 lz4
import zstandard  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.legacy_records import LegacyRecordBatchBuilder  # noqa: E402
from kafka.record.memory_records import MemoryRecordsBuilder  # noqa: E402

from kinspect.codec.errors import DecodeError
from kinspect.codec.records import (
    DEFAULT_MAX_DECOMPRESSED,
    BatchScan,
    Partial,
    RecordBatch,
    RecordSet,
    decode_records,
    render_bytes,
    scan_batches,
    summarize,
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAME = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
TS0 = 1_700_000_000_000

HAS_CODEC = {
    NONE: True,
    GZIP: True,
    SNAPPY: kafka_codec.has_snappy(),
    LZ4: kafka_codec.has_lz4(),
    ZSTD: kafka_codec.has_zstd(),
}

V2_COMBOS = [(2, c) for c in (NONE, GZIP, SNAPPY, LZ4, ZSTD)]
LEGACY_COMBOS = [(m, c) for m in (0, 1) for c in (NONE, GZIP, SNAPPY, LZ4)]


def _need(codec):
    """The peer implementation must be able to build this codec; a missing library
    is a broken test environment (the [test] extra), not a reason to skip."""
    assert HAS_CODEC[codec], f"kafka-python lacks the {CODEC_NAME[codec]} codec library"


# ---------------------------------------------------------------------------
# fixtures built with kafka-python
# ---------------------------------------------------------------------------


def sample_records(magic, n=25):
    """(timestamp, key, value, headers) tuples; compressible values so that
    kafka-python keeps the compression."""
    out = []
    for i in range(n):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        if i % 11 == 5:
            value = None
        elif i % 4 == 3:
            value = bytes(range(256)) * 2  # binary
        else:
            value = (f"value {i} " * 20).encode()
        headers = []
        if magic == 2 and i % 3 == 1:
            headers = [("trace-id", f"t{i}".encode()), ("empty", b""), ("nullv", None), ("ünï", b"\x00\xff")]
        out.append((TS0 + i * 17, key, value, headers))
    return out


def build(magic, codec, recs, offset=0, **kw) -> bytes:
    b = MemoryRecordsBuilder(magic, codec, batch_size=1 << 22, offset=offset, **kw)
    for ts, key, value, headers in recs:
        assert b.append(ts, key, value, headers=headers or None) is not None
    b.close()
    return bytes(b.buffer())


def kp_read(data: bytes):
    """kafka-python's view: list of (batch, crc_ok, [records])."""
    out = []
    mr = MemoryRecords(data)
    while mr.has_next():
        batch = mr.next_batch()
        crc_ok = batch.validate_crc()
        out.append((batch, crc_ok, list(batch)))
    return out


def assert_matches_kafka_python(data: bytes, rs: RecordSet):
    expected = kp_read(data)
    assert len(rs.batches) == len(expected)
    for ours, (theirs, crc_ok, trecs) in zip(rs.batches, expected):
        assert ours.magic == theirs.magic
        assert ours.crc_valid == crc_ok
        assert ours.compression == CODEC_NAME[theirs.compression_type]
        assert ours.size_bytes == theirs.size_in_bytes
        if ours.magic == 2:
            assert ours.base_offset == theirs.base_offset
            assert ours.crc == theirs.crc
            assert ours.attributes == theirs.attributes
            assert ours.partition_leader_epoch == theirs.leader_epoch
            assert ours.last_offset_delta == theirs.last_offset_delta
            assert ours.last_offset == theirs.last_offset
            assert ours.base_timestamp == theirs.first_timestamp
            assert ours.max_timestamp == theirs.max_timestamp
            assert ours.producer_id == theirs.producer_id
            assert ours.producer_epoch == theirs.producer_epoch
            assert ours.base_sequence == theirs.base_sequence
            assert ours.record_count == theirs.records_count
            assert ours.is_transactional == theirs.is_transactional
            assert ours.is_control == theirs.is_control_batch
            assert ours.timestamp_type == ("CreateTime", "LogAppendTime")[theirs.timestamp_type]
        else:
            assert ours.base_offset == theirs.base_offset
            assert ours.timestamp_type == (None if theirs.timestamp_type is None else ("CreateTime", "LogAppendTime")[theirs.timestamp_type])
        assert len(ours.records) == len(trecs)
        for r, t in zip(ours.records, trecs):
            assert r.offset == t.offset
            assert r.timestamp == t.timestamp
            assert r.key == t.key
            assert r.value == t.value
            assert r.headers == list(t.headers)
            if ours.magic < 2:
                assert r.crc_valid == t.validate_crc()
            if ours.is_control:
                assert r.control is not None
                assert r.control.version == t.version
                assert r.control.type == t.type


def recrc_v2(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


def rebuild_v2(batch: bytes, codec: int, payload: bytes, count: int | None = None) -> bytes:
    """Same v2 batch with a new (e.g. differently compressed) records payload."""
    out = bytearray(batch[:61]) + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    (attrs,) = struct.unpack_from(">h", out, 21)
    struct.pack_into(">h", out, 21, (attrs & ~7) | codec)
    if count is not None:
        struct.pack_into(">i", out, 57, count)
    return bytes(recrc_v2(out))


def v2_plain(recs=None, **kw) -> bytes:
    return build(2, NONE, sample_records(2) if recs is None else recs, **kw)


def set_base_offset(batch: bytes, base: int) -> bytes:
    return struct.pack(">q", base) + batch[8:]


# ---------------------------------------------------------------------------
# round trips against kafka-python
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("magic,codec", V2_COMBOS + LEGACY_COMBOS)
def test_cross_check_kafka_python(magic, codec):
    _need(codec)
    recs = sample_records(magic)
    if magic < 2 and codec:
        recs = [r for r in recs if r[2] is not None] or recs
    data = build(magic, codec, recs)
    rs = decode_records(data)
    assert rs.partial is None
    assert rs.record_count == len(recs)
    assert {b.compression for b in rs.batches} == {CODEC_NAME[codec]}
    assert all(b.crc_valid for b in rs.batches)
    assert_matches_kafka_python(data, rs)
    flat = list(rs.iter_records())
    for (ts, key, value, headers), r in zip(recs, flat):
        assert r.key == key and r.value == value
        assert r.timestamp == (None if magic == 0 else ts)
        assert r.headers == headers
    if codec:
        b = rs.batches[0]
        assert b.uncompressed_size > b.compressed_size
    json.dumps(rs.to_dict())


@pytest.mark.parametrize("magic,codec", V2_COMBOS + LEGACY_COMBOS)
def test_several_batches_absolute_offsets(magic, codec):
    _need(codec)
    recs = [(TS0 + i, b"k%d" % i, b"payload " * 30, []) for i in range(5)]
    parts = []
    next_offset = 1000
    for _ in range(3):
        batch = build(magic, codec, recs, offset=0 if magic == 2 else next_offset)
        if magic == 2:
            batch = set_base_offset(batch, next_offset)  # broker-assigned
        elif magic == 1 and codec:
            # Wrapper offset = absolute offset of the last inner message (KIP-31);
            # not covered by the message CRC.
            batch = set_base_offset(batch, next_offset + len(recs) - 1)
        parts.append(batch)
        next_offset += len(recs)
    data = b"".join(parts)
    rs = decode_records(data)
    assert [r.offset for r in rs.iter_records()] == list(range(1000, 1015))
    assert_matches_kafka_python(data, rs)
    positions = [b.position for b in rs.batches]
    assert positions[0] == 0 and positions == sorted(positions)
    assert sum(b.size_bytes for b in rs.batches) == len(data)


def test_v2_header_fields_and_flags():
    recs = sample_records(2, 10)
    data = build(2, NONE, recs, transactional=True, producer_id=4242, producer_epoch=7, base_sequence=99)
    data = bytearray(set_base_offset(data, 5000))
    struct.pack_into(">i", data, 12, 33)  # partition leader epoch (not in the CRC)
    rs = decode_records(bytes(data))
    (b,) = rs.batches
    assert b.crc_valid
    assert (b.base_offset, b.partition_leader_epoch, b.magic) == (5000, 33, 2)
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (4242, 7, 99)
    assert b.is_transactional and not b.is_control
    assert b.last_offset_delta == 9 and b.last_offset == 5009
    assert b.base_timestamp == TS0 and b.max_timestamp == recs[-1][0]
    assert b.record_count == 10 and b.batch_length == len(data) - 12
    assert b.compressed_size == b.uncompressed_size == len(data) - 61
    assert [r.offset for r in b.records] == list(range(5000, 5010))
    assert_matches_kafka_python(bytes(data), rs)


def test_log_append_time_uses_max_timestamp():
    data = bytearray(build(2, GZIP, sample_records(2, 6)))
    struct.pack_into(">q", data, 35, TS0 + 999_999)  # maxTimestamp
    (attrs,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attrs | 0x08)
    rs = decode_records(bytes(recrc_v2(data)))
    (b,) = rs.batches
    assert b.crc_valid and b.timestamp_type == "LogAppendTime"
    assert {r.timestamp for r in b.records} == {TS0 + 999_999}
    assert_matches_kafka_python(bytes(data), rs)


@pytest.mark.parametrize("codec", [NONE, GZIP])
def test_legacy_v1_log_append_time(codec):
    data = bytearray(build(1, codec, [(TS0 + i, None, b"v" * 50, []) for i in range(3)]))
    data[17] |= 0x08  # attributes of the (wrapper) message
    struct.pack_into(">q", data, 18, TS0 + 5)
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    rs = decode_records(bytes(data))
    assert rs.batches[0].timestamp_type == "LogAppendTime"
    assert rs.batches[0].records[0].timestamp == TS0 + 5
    assert_matches_kafka_python(bytes(data), rs)


def test_headers_and_nulls():
    recs = [
        (TS0, None, None, []),
        (TS0 + 1, b"", b"", [("a", None), ("b", b"")]),
        (TS0 + 2, b"k", b"v", [("x" * 300, b"y" * 1000)]),
    ]
    rs = decode_records(v2_plain(recs))
    r0, r1, r2 = rs.batches[0].records
    assert r0.key is None and r0.value is None and r0.headers == []
    assert r1.key == b"" and r1.value == b"" and r1.headers == [("a", None), ("b", b"")]
    assert r2.headers == [("x" * 300, b"y" * 1000)]
    d = rs.to_dict()
    rec0 = d["batches"][0]["records"][0]
    assert rec0["key"] is None and rec0["value"] is None and rec0["key_size"] is None
    rec1 = d["batches"][0]["records"][1]
    assert rec1["key"] == "''" and rec1["headers"] == [{"key": "a", "value": None}, {"key": "b", "value": "''"}]


# ---------------------------------------------------------------------------
# control batches
# ---------------------------------------------------------------------------


def control_batch(ctype: int, coordinator_epoch: int = 5) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True,
        producer_id=77, producer_epoch=1, base_sequence=-1, batch_size=1 << 16,
    )
    b.append(0, timestamp=TS0, key=struct.pack(">hh", 0, ctype), value=struct.pack(">hi", 0, coordinator_epoch), headers=[])
    data = bytearray(b.build())
    (attrs,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attrs | 0x20 | 0x10)
    return bytes(recrc_v2(data))


@pytest.mark.parametrize("ctype,name", [(0, "ABORT"), (1, "COMMIT")])
def test_control_batch(ctype, name):
    data = set_base_offset(control_batch(ctype, coordinator_epoch=12), 300)
    rs = decode_records(data)
    (b,) = rs.batches
    assert b.is_control and b.is_transactional and b.crc_valid
    (r,) = b.records
    assert r.offset == 300
    assert (r.control.version, r.control.type, r.control.type_name) == (0, ctype, name)
    assert r.control.coordinator_epoch == 12
    assert_matches_kafka_python(data, rs)
    assert rs.to_dict()["batches"][0]["records"][0]["control"]["type_name"] == name


def test_control_batch_with_short_key_is_an_error():
    b = DefaultRecordBatchBuilder(2, 0, True, 77, 1, -1, 1 << 16)
    b.append(0, timestamp=TS0, key=b"\x00", value=None, headers=[])
    data = bytearray(b.build())
    (attrs,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attrs | 0x20)
    with pytest.raises(DecodeError) as ei:
        decode_records(bytes(recrc_v2(data)))
    assert "control record key" in ei.value.expected
    assert ei.value.path == "batches[0].records[0]"


# ---------------------------------------------------------------------------
# compression variants
# ---------------------------------------------------------------------------


def _inner_payload():
    """(uncompressed v2 batch, its raw records payload)."""
    batch = v2_plain(sample_records(2, 40))
    return batch, batch[61:]


def test_snappy_xerial_and_raw():
    _need(SNAPPY)
    batch, payload = _inner_payload()
    xerial = kafka_codec.snappy_encode(payload, xerial_compatible=True, xerial_blocksize=512)
    assert xerial.startswith(b"\x82SNAPPY\x00")
    raw = bytes(cramjam.snappy.compress_raw(payload))
    framed = bytes(cramjam.snappy.compress(payload))  # official framing format
    assert framed.startswith(b"\xff\x06\x00\x00sNaPpY")
    expected = decode_records(batch).batches[0].records
    for comp in (xerial, raw, framed):
        rs = decode_records(rebuild_v2(batch, SNAPPY, comp))
        assert rs.batches[0].compression == "snappy" and rs.batches[0].crc_valid
        assert rs.batches[0].records == expected
        assert rs.batches[0].uncompressed_size == len(payload)


def test_lz4_variants():
    lz4_frame = lz4.frame
    batch, payload = _inner_payload()
    expected = decode_records(batch).batches[0].records
    variants = [
        lz4_frame.compress(payload, block_linked=False, content_checksum=True, block_checksum=True, store_size=True),
        lz4_frame.compress(payload, block_linked=False, block_size=lz4_frame.BLOCKSIZE_MAX64KB) * 1,
        lz4_frame.compress(payload, block_linked=True),  # linked blocks: cramjam fallback
        lz4_frame.compress(payload[:1000], store_size=False) + lz4_frame.compress(payload[1000:]),  # 2 frames
    ]
    for comp in variants:
        rs = decode_records(rebuild_v2(batch, LZ4, comp))
        assert rs.batches[0].records == expected


def test_lz4_magic0_broken_header_checksum_kafka_3160():
    _need(LZ4)
    recs = [(TS0, b"k", b"lz4 legacy " * 40, []) for _ in range(4)]
    data = build(0, LZ4, recs)
    # The frame's header checksum is the broken one: a strict decoder rejects it.
    value_start = 12 + 4 + 1 + 1 + 4 + 4  # wrapper: offset, size, crc, magic, attrs, key len(-1), value len
    frame = data[value_start:]
    with pytest.raises(Exception):
        cramjam.lz4.decompress(frame)
    rs = decode_records(data)
    assert [r.value for r in rs.iter_records()] == [r[2] for r in recs]
    assert_matches_kafka_python(data, rs)


def test_gzip_multi_member_and_zstd_without_content_size():
    batch, payload = _inner_payload()
    expected = decode_records(batch).batches[0].records
    mm = gzip.compress(payload[:500]) + gzip.compress(payload[500:])
    rs = decode_records(rebuild_v2(batch, GZIP, mm))
    assert rs.batches[0].records == expected
    z = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    rs = decode_records(rebuild_v2(batch, ZSTD, z))
    assert rs.batches[0].records == expected
    # Content much larger than the initial buffer guess (4 x compressed size).
    big = [(TS0, None, b"\x00" * 300_000, [])]
    zbatch = build(2, NONE, big)
    z = zstandard.ZstdCompressor(write_content_size=False).compress(zbatch[61:])
    rs = decode_records(rebuild_v2(zbatch, ZSTD, z))
    assert rs.batches[0].records[0].value == b"\x00" * 300_000


def test_many_gzip_members_cost_work_linear_in_the_payload(monkeypatch):
    """A gzip payload of 20000 members (the records split over them, then empty
    ones) decodes, and the bytes zlib is handed plus those it copies back out as
    ``unused_data`` stay a small multiple of the payload: handing it all the rest
    at every member was quadratic (about 4 GB of copying for these 400 kB; a
    100 MB frame of them took hours)."""
    batch, payload = _inner_payload()
    expected = decode_records(batch).batches[0].records
    empty = gzip.compress(b"")
    mm = gzip.compress(payload[:300]) + gzip.compress(payload[300:]) + empty * 20000
    work = [0]
    real = zlib.decompressobj

    class Counting:
        def __init__(self, *a):
            self.d = real(*a)

        def decompress(self, data, *a):
            work[0] += len(data)
            out = self.d.decompress(data, *a)
            work[0] += len(self.d.unused_data)
            return out

        def __getattr__(self, name):
            return getattr(self.d, name)

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    rs = decode_records(rebuild_v2(batch, GZIP, mm))
    assert rs.batches[0].records == expected
    assert work[0] <= 16 * len(mm), (work[0], len(mm))


def test_legacy_magic1_wrapper_offset_zero_keeps_inner_offsets():
    recs = [(TS0 + i, None, b"x" * 40, []) for i in range(4)]
    data = build(1, GZIP, recs, offset=0)
    rs = decode_records(data)
    assert [r.offset for r in rs.iter_records()] == [0, 1, 2, 3]
    assert rs.batches[0].base_offset == 0


def test_legacy_wrapper_offset_below_last_inner_is_an_error():
    recs = [(TS0 + i, None, b"x" * 40, []) for i in range(4)]
    data = set_base_offset(build(1, GZIP, recs), 2)
    with pytest.raises(DecodeError) as ei:
        decode_records(data)
    assert ei.value.offset == 0


# ---------------------------------------------------------------------------
# CRC, partial batches, empty input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("magic,codec", [(2, NONE), (2, GZIP), (1, NONE), (0, NONE), (1, GZIP)])
def test_crc_corruption_is_reported_not_raised(magic, codec):
    recs = [(TS0 + i, b"k", b"some value here " * 5, []) for i in range(3)]
    data = bytearray(build(magic, codec, recs))
    # flip a bit in the stored CRC (v2: bytes 17..21; legacy: bytes 12..16)
    data[18 if magic == 2 else 13] ^= 0x01
    rs = decode_records(bytes(data))
    b = rs.batches[0]
    assert b.crc_valid is False and b.crc != b.crc_computed
    assert rs.record_count == 3
    assert_matches_kafka_python(bytes(data), rs)
    # corrupt a value byte (uncompressed): data still decodes, CRC invalid
    if codec == NONE:
        data = bytearray(build(magic, codec, recs))
        idx = bytes(data).index(b"some value")
        data[idx] = ord("S")
        rs = decode_records(bytes(data))
        assert rs.batches[0].crc_valid is False
        assert rs.batches[0].records[0].value.startswith(b"Some value")
        if magic < 2:
            assert rs.batches[0].records[0].crc_valid is False


@pytest.mark.parametrize("magic,codec", [(2, NONE), (2, ZSTD), (1, GZIP), (0, NONE)])
def test_truncated_last_batch_is_partial(magic, codec):
    _need(codec)
    recs = [(TS0 + i, b"k", b"v" * 100, []) for i in range(5)]
    first = build(magic, codec, recs)
    # an uncompressed legacy message set is one "batch" per message: cut inside one
    second = build(magic, codec, recs[:1] if magic < 2 and codec == NONE else recs, offset=5)
    whole = first + second
    for cut in (1, 11, 12, 13, 40, len(second) - 1):
        data = first + second[:cut]
        rs = decode_records(data)
        n_first = len(decode_records(first).batches)
        assert len(rs.batches) == n_first
        assert rs.partial == Partial(
            offset=len(first), available=cut, needed=None if cut < 12 else decode_records(second).batches[0].size_bytes
        )
        assert rs.size_bytes == len(data)
        assert json.loads(json.dumps(rs.to_dict()))["partial"]["available"] == cut
    assert decode_records(whole).partial is None


def test_only_partial():
    data = v2_plain()[:30]
    rs = decode_records(data)
    assert rs.batches == [] and rs.partial.offset == 0 and rs.partial.available == 30
    assert rs.record_count == 0


def test_empty_and_none():
    rs = decode_records(None)
    assert rs.is_null and rs.batches == [] and rs.partial is None and rs.record_count == 0
    assert rs.to_dict() == {"batches": [], "partial": None, "record_count": 0, "size_bytes": 0, "is_null": True}
    rs = decode_records(b"")
    assert not rs.is_null and rs.batches == [] and rs.partial is None
    assert summarize(rs) == (0, frozenset(), 0)


def test_memoryview_and_bytearray_input():
    data = v2_plain()
    a = decode_records(data)
    assert decode_records(memoryview(b"xx" + data)[2:]) == a
    assert decode_records(bytearray(data)) == a
    with pytest.raises(TypeError):
        decode_records("not bytes")  # type: ignore[arg-type]


def test_zero_record_batch():
    batch = v2_plain([(TS0, b"k", b"v", [])])
    data = rebuild_v2(batch, NONE, b"", count=0)
    (b,) = decode_records(data).batches
    assert b.records == [] and b.record_count == 0 and b.crc_valid


# ---------------------------------------------------------------------------
# malformed input -> DecodeError with offset/expected
# ---------------------------------------------------------------------------


def _expect_error(data, **kw) -> DecodeError:
    with pytest.raises(DecodeError) as ei:
        decode_records(data, **kw)
    err = ei.value
    assert err.offset is not None and 0 <= err.offset <= len(data)
    assert err.expected
    str(err)
    json.dumps(err.to_dict())
    return err


def test_huge_record_count_in_small_batch():
    batch = v2_plain([(TS0, b"k", b"v", [])])
    data = bytearray(batch)
    struct.pack_into(">i", data, 57, 2**31 - 1)
    assert len(data) < 80
    err = _expect_error(bytes(data))
    assert err.offset == 57 and "record count" in err.expected
    # negative count
    struct.pack_into(">i", data, 57, -5)
    err = _expect_error(bytes(data))
    assert err.offset == 57


def test_huge_record_count_in_compressed_batch():
    data = bytearray(build(2, GZIP, sample_records(2, 10)))
    struct.pack_into(">i", data, 57, 2**31 - 1)
    err = _expect_error(bytes(recrc_v2(data)))
    assert err.offset == 57 and "record count" in err.expected


def test_record_length_past_batch_end():
    prefix = v2_plain([(TS0, b"a", b"b", [])])
    batch = bytearray(v2_plain([(TS0, b"key", b"value", [])]))
    assert batch[61] < 0x80
    batch[61] = 0x7E  # zigzag 63: longer than the batch
    data = prefix + bytes(batch)
    err = _expect_error(data)
    assert err.offset == len(prefix) + 61
    assert "record length" in err.expected
    assert err.path == "batches[1].records[0]"


def test_bad_varint():
    batch = bytearray(v2_plain([(TS0, b"key", b"value" * 10, [])]))
    # timestampDelta at 61 + len(varint) + attributes
    pos = 61 + 1 + 1
    batch[pos : pos + 6] = b"\xff" * 6  # overlong/unterminated varlong spills
    err = _expect_error(bytes(batch))
    assert err.path == "batches[0].records[0]"
    # offsetDelta varint longer than 5 bytes inside a record
    batch = bytearray(v2_plain([(TS0, b"key" * 10, b"value" * 10, [])]))
    length_size = 1 if batch[61] < 0x80 else 2
    pos = 61 + length_size + 1 + 1  # after record length, attributes, timestampDelta
    batch[pos : pos + 6] = b"\x80\x80\x80\x80\x80\x01"
    err = _expect_error(bytes(batch))
    assert "offsetDelta" in err.expected and err.offset == pos


def test_key_and_header_lengths_out_of_range():
    batch = bytearray(v2_plain([(TS0, b"key", b"value", [("h", b"hv")])]))
    key_len_pos = 61 + 1 + 1 + 1 + 1
    batch[key_len_pos] = 0x7E  # key length 63
    err = _expect_error(bytes(batch))
    assert "key" in err.expected and err.offset == key_len_pos + 1  # the key bytes
    batch[key_len_pos] = 0x03  # key length -2
    err = _expect_error(bytes(batch))
    assert "key length" in err.expected and err.offset == key_len_pos
    batch = bytearray(v2_plain([(TS0, b"key", b"value", [("h", b"hv")])]))
    hc_pos = bytes(batch).index(b"value") + 5
    batch[hc_pos] = 0x7E  # 63 headers
    err = _expect_error(bytes(batch))
    assert "header count" in err.expected and err.offset == hc_pos
    batch[hc_pos] = 0x01  # -1 headers
    err = _expect_error(bytes(batch))
    assert "header count" in err.expected


def test_trailing_bytes_after_records():
    batch = v2_plain([(TS0, b"k", b"v", [])])
    data = rebuild_v2(batch, NONE, batch[61:] + b"\x00\x00\x00")
    err = _expect_error(data)
    assert err.expected == "end of record batch"


def test_batch_level_errors():
    batch = v2_plain()
    # length below the minimum
    data = bytearray(batch)
    struct.pack_into(">i", data, 8, 3)
    err = _expect_error(bytes(data))
    assert err.offset == 8 and "batch length" in err.expected
    # negative length
    struct.pack_into(">i", data, 8, -1)
    assert _expect_error(bytes(data)).offset == 8
    # v2 length too short for the header
    data = bytearray(batch[:40])
    struct.pack_into(">i", data, 8, 28)
    err = _expect_error(bytes(data))
    assert err.offset == 8
    # unknown magic
    data = bytearray(batch)
    data[16] = 3
    err = _expect_error(bytes(data))
    assert err.offset == 16 and "magic" in err.expected
    # unknown compression codec
    data = bytearray(batch)
    data[22] |= 0x07
    err = _expect_error(bytes(recrc_v2(data)))
    assert err.offset == 21
    # corrupt compressed payload
    data = bytearray(build(2, GZIP, sample_records(2)))
    data[70:90] = b"\x00" * 20
    err = _expect_error(bytes(data))
    assert err.offset == 61 and "gzip" in err.reason and "CRC" in err.reason


def test_legacy_errors():
    data = bytearray(build(1, NONE, [(TS0, b"key", b"value", [])]))
    struct.pack_into(">i", data, 26, 1000)  # key length
    err = _expect_error(bytes(data))
    assert err.offset == 26 and "key length" in err.expected
    data = bytearray(build(1, NONE, [(TS0, b"key", b"value", [])]))
    struct.pack_into(">i", data, 26, -2)
    assert _expect_error(bytes(data)).offset == 26
    # compressed wrapper whose inner message set is broken
    inner = build(1, NONE, [(TS0, None, b"x" * 30, [])])
    bad_inner = inner[:-3]  # truncated inner message
    wrapper = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    wrapper.append(0, TS0, None, gzip.compress(bad_inner))
    data = bytearray(wrapper.build())
    data[17] |= GZIP
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    err = _expect_error(bytes(data))
    assert err.path == "batches[0].records[0]" and "decompressed gzip" in err.reason
    # nested compression
    nested = build(1, GZIP, [(TS0, None, b"y" * 80, [])])
    wrapper = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    wrapper.append(0, TS0, None, gzip.compress(nested))
    data = bytearray(wrapper.build())
    data[17] |= GZIP
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    err = _expect_error(bytes(data))
    assert "nested" in err.reason


def test_error_offset_is_relative_to_records_start_across_batches():
    good = v2_plain()
    bad = bytearray(v2_plain([(TS0, b"key", b"value", [])]))
    bad[61] = 0x7E
    err = _expect_error(good + good + bytes(bad))
    assert err.offset >= 2 * len(good) + 61
    assert err.path == "batches[2].records[0]"


# ---------------------------------------------------------------------------
# decompression bombs
# ---------------------------------------------------------------------------


def _bomb_batch(codec: int, size: int) -> bytes:
    big = build(2, NONE, [(TS0, None, b"\x00" * size, [])])
    payload = big[61:]
    if codec == GZIP:
        comp = gzip.compress(payload)
    elif codec == SNAPPY:
        comp = kafka_codec.snappy_encode(payload)
    elif codec == LZ4:
        comp = bytes(cramjam.lz4.compress(payload))
    else:
        comp = bytes(cramjam.zstd.compress(payload))
    return rebuild_v2(big, codec, comp)


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_decompression_bomb_capped(codec):
    if codec == SNAPPY:
        _need(SNAPPY)  # xerial framing from kafka-python's encoder
    data = _bomb_batch(codec, 4 << 20)
    assert len(data) < 300_000
    err = _expect_error(data, max_decompressed=1 << 20)
    assert "max_decompressed" in err.reason and err.offset == 61
    # within budget it decodes
    rs = decode_records(data, max_decompressed=8 << 20)
    assert len(rs.batches[0].records[0].value) == 4 << 20


def test_zstd_bomb_without_content_size_default_cap():
    size = DEFAULT_MAX_DECOMPRESSED + (1 << 20)
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    chunk = b"\x00" * (1 << 20)
    comp = b"".join(cobj.compress(chunk) for _ in range(size >> 20)) + cobj.flush()
    batch = v2_plain([(TS0, None, b"x", [])])
    err = _expect_error(rebuild_v2(batch, ZSTD, comp))
    assert "max_decompressed" in err.reason


_EMPTY_RECORD = bytes([12, 0, 0, 0, 1, 1, 0])  # length 6, attrs, deltas 0, null key/value, 0 headers


def test_many_records_from_a_small_compressed_payload_are_refused_before_built():
    """1.4 KB of zstd held 2.3 million empty records: each a Python object, 450 MB
    for ``kinspect show``. Past ``max_records`` (raised to what the bytes could hold
    uncompressed) it is a DecodeError at the batch's count, before any is built."""
    n = 300_000
    comp = bytes(cramjam.zstd.compress(_EMPTY_RECORD * n, level=19))
    data = rebuild_v2(v2_plain([(TS0, None, b"x", [])]), ZSTD, comp, count=n)
    assert len(data) < 2_000
    tracemalloc.start()
    try:
        err = _expect_error(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "max_records" in err.reason and err.offset == 57 and err.path == "batches[0]"
    assert peak < 16 << 20, peak  # the 2 MB payload decompressed, no records
    assert decode_records(data, max_records=n).record_count == n
    # uncompressed, as many records as the bytes hold are always decoded
    plain = rebuild_v2(data, NONE, _EMPTY_RECORD * n, count=n)
    assert decode_records(plain, max_records=10).record_count == n


def test_max_records_counts_legacy_inner_messages_across_batches():
    wrapper = build(1, GZIP, [(TS0, None, b"", [])] * 50)
    assert len(wrapper + wrapper) // 7 < 60
    assert decode_records(wrapper + wrapper, max_records=100).record_count == 100
    err = _expect_error(wrapper + wrapper, max_records=60)
    assert "max_records" in err.reason and err.path == "batches[1].records[10]"


def test_decompression_budget_is_per_call():
    one = _bomb_batch(GZIP, 600_000)
    decode_records(one, max_decompressed=1 << 20)
    err = _expect_error(one + one, max_decompressed=1 << 20)
    assert err.path == "batches[1]" and err.offset == len(one) + 61


# ---------------------------------------------------------------------------
# rendering, to_dict, summarize
# ---------------------------------------------------------------------------


def test_render_bytes():
    assert render_bytes(b"hello") == "'hello'"
    assert render_bytes(b"") == "''"
    assert render_bytes(None) == "null"
    assert render_bytes(b"\x00\xff") == "0x00ff"
    assert render_bytes(b"\x00\xff" * 512) == "0x" + "00ff" * 16 + "… (1024 B)"
    assert render_bytes(b"a" * 100, limit=10) == "'aaaaaaaaaa'… (100 B)"
    assert render_bytes("héllo\n'q'".encode()) == "'héllo\\n\\'q\\''"
    assert render_bytes(b"\x00" * 100, limit=None) == "0x" + "00" * 100
    assert render_bytes(memoryview(b"abc")) == "'abc'"
    assert render_bytes("日本".encode() * 40, limit=5) == "'日本日本日'… (240 B)"


def test_to_dict_json_and_summarize():
    data = build(2, GZIP, sample_records(2)) + build(1, NONE, sample_records(1, 3)) + v2_plain()[:20]
    rs = decode_records(data)
    d = json.loads(json.dumps(rs.to_dict()))
    assert d["record_count"] == rs.record_count == 25 + 3 + 0
    assert d["batches"][0]["compression"] == "gzip"
    assert d["partial"] == {"offset": len(data) - 20, "available": 20, "needed": len(v2_plain())}
    rec = d["batches"][0]["records"][1]
    assert rec["key"] == "'key-1'" and rec["headers"][0] == {"key": "trace-id", "value": "'t1'"}
    assert d["batches"][0]["records"][3]["value"].startswith("0x000102")
    s = summarize(rs)
    assert s == (28, frozenset({"gzip", "none"}), len(data))
    assert s.record_count == 28 and s.bytes == len(data)
    assert isinstance(rs.batches[0], RecordBatch)
    # raw bytes stay on the objects
    assert rs.batches[0].records[1].key == b"key-1"


# ---------------------------------------------------------------------------
# property tests: nothing but DecodeError escapes
# ---------------------------------------------------------------------------


def _decode_ok_or_decode_error(data: bytes):
    try:
        scan = scan_batches(data)
    except DecodeError as e:
        assert e.offset is None or 0 <= e.offset <= len(data)
        scan = e
    try:
        rs = decode_records(data, max_decompressed=1 << 20)
    except DecodeError as e:
        assert e.offset is None or 0 <= e.offset <= len(data)
        return
    json.dumps(rs.to_dict())
    # what decodes, the header scan reads the same way (or leaves to the decoder)
    assert not isinstance(scan, DecodeError), scan
    if scan is not None:
        assert scan == _figures(rs)


def _figures(rs: RecordSet) -> BatchScan:
    return BatchScan(rs.record_count, len(rs.batches),
                     frozenset(b.compression for b in rs.batches), rs.partial is not None)


def test_batch_header_scan_agrees_with_the_decoder():
    """scan_batches (headers only) counts what decode_records decodes, on batches
    built by kafka-python, concatenated and cut short; legacy sets are left to the
    decoder (None)."""
    recs = sample_records(2, 5)
    parts = [v2_plain(recs), control_batch(1)]
    for c in (GZIP, SNAPPY, LZ4, ZSTD):
        _need(c)
        parts.append(build(2, c, recs))
    data = b"".join(parts)
    for cut in (len(data), len(data) - 1, len(data) - 30, len(parts[0]) + 40, 5, 0):
        chunk = data[:cut]
        scan = scan_batches(chunk)
        assert scan == _figures(decode_records(chunk)), cut
    assert scan_batches(data).compressions == {"none", "gzip", "snappy", "lz4", "zstd"}
    assert scan_batches(data).record_count == 5 * (len(parts) - 1) + 1
    assert scan_batches(None) == BatchScan(0, 0, frozenset(), False)
    assert scan_batches(build(1, GZIP, sample_records(1, 3))) is None
    assert scan_batches(v2_plain(recs) + build(0, NONE, sample_records(0, 2))) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_only_decode_error(data):
    _decode_ok_or_decode_error(data)


_SEEDS = []


def _seeds():
    if not _SEEDS:
        for c in (GZIP, SNAPPY, LZ4, ZSTD):
            _need(c)
        recs = sample_records(2, 4)
        _SEEDS.extend(
            [
                v2_plain(recs),
                build(2, GZIP, recs),
                build(2, SNAPPY, recs),
                build(2, LZ4, recs),
                build(2, ZSTD, recs),
                build(1, GZIP, sample_records(1, 4)),
                build(0, NONE, sample_records(0, 3)),
                build(1, SNAPPY, sample_records(1, 3)),
                control_batch(1),
            ]
        )
    return _SEEDS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 8),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.booleans(),
)
def test_mutated_batches_only_decode_error(seed_index, mutations, keep_length):
    data = bytearray(_seeds()[seed_index])
    for where, byte in mutations:
        # bias towards the headers and the start of the payload
        idx = where % len(data) if where % 3 else where % min(len(data), 90)
        data[idx] = byte
    if keep_length:
        struct.pack_into(">i", data, 8, len(data) - 12)
        if data[16] == 2:
            recrc_v2(data)
    _decode_ok_or_decode_error(bytes(data))
