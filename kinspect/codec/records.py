"""Sans-io decoder for Kafka ``records`` fields.

A ``records`` field is the opaque byte blob carried by Produce requests
(``TopicData[].PartitionData[].Records``) and Fetch responses
(``Responses[].Partitions[].Records``). It holds a sequence of

* **record batches**, magic 2 (Kafka >= 0.11, KIP-98, Kafka protocol guide
  "Record Batch"), or
* **legacy message sets**, magic 0 and 1 (Kafka protocol guide "Message Sets"),
  where each entry is one message and a compressed *wrapper* message carries a
  whole compressed inner message set in its value.

Entry point: :func:`decode_records`. It returns a :class:`RecordSet` of
:class:`RecordBatch` objects (each legacy message, wrapper or not, is one batch,
as in Kafka's own reader) holding :class:`Record` objects, plus a
:class:`Partial` marker when the data ends in a truncated batch (Fetch responses
may do that). Every object has ``to_dict()`` producing JSON-able dicts; raw
``bytes`` stay on the objects.

Units: offsets are Kafka log offsets; timestamps are epoch **milliseconds**;
sizes are bytes.

Errors: malformed data raises :class:`~kinspect.codec.errors.DecodeError` whose
``offset`` is relative to the start of the records bytes given to
:func:`decode_records` (for an error inside a compressed payload, the offset of
that compressed payload, with the position inside the decompressed bytes named
in ``reason``), ``expected`` names the item being read and ``path`` is e.g.
``"batches[2].records[7]"``. A bad CRC is *not* an error: it is reported as
``crc_valid=False``. No other exception type escapes for any input bytes.

Compression (attributes bits 0-2): gzip (stdlib :mod:`zlib`, multi-member
streams accepted), snappy (Java xerial framing ``b"\\x82SNAPPY\\x00"`` + int32
length-prefixed blocks, raw snappy, or the official snappy framing format),
lz4 (LZ4 frame format, parsed here so the header checksum is not checked: magic
0 producers wrote a wrong one, KAFKA-3160), zstd (magic 2 only). Decompression
uses ``cramjam`` block/stream functions and is capped by ``max_decompressed``.
"""

from __future__ import annotations

import codecs
import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import cramjam

from .errors import DecodeError


def _crc32c(data: memoryview) -> int:
    """CRC-32C (Castagnoli) through the ``crc32c`` package, imported on first use
    (its import pulls in ``socket``, which the sans-io codec otherwise avoids)."""
    global _crc32c_fn
    if _crc32c_fn is None:
        import crc32c

        _crc32c_fn = crc32c.crc32c
    return _crc32c_fn(data)


_crc32c_fn = None

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "COMPRESSION_NAMES",
    "BatchScan",
    "scan_batches",
    "CONTROL_TYPES",
    "ControlRecord",
    "Record",
    "RecordBatch",
    "Partial",
    "RecordSet",
    "RecordSummary",
    "decode_records",
    "render_bytes",
    "summarize",
]

#: Default cap on the total number of decompressed bytes one
#: :func:`decode_records` call may produce (64 MiB).
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024

#: Default cap on the records one :func:`decode_records` call builds out of
#: compressed payloads beyond what the bytes given could hold uncompressed (each
#: record is a Python object of some hundred bytes, a record on the wire 7 bytes
#: at least): 1.4 KB of zstd otherwise built 2.3 million records.
DEFAULT_MAX_RECORDS = 200_000

#: Compression codec id (attributes & 0x07) -> name.
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

#: Control record type (key int16 ``type``) -> name, from Kafka's
#: ``ControlRecordType`` (0/1 from KIP-98, the others from KRaft).
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}

_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

# ---------------------------------------------------------------------------
# Wire layouts
# ---------------------------------------------------------------------------

#: Offset(8) + Length(4): common prefix of every batch / message-set entry.
_LOG_OVERHEAD = 12
#: Kafka's minimum message size (LegacyRecord.RECORD_OVERHEAD_V0).
_MIN_RECORD_OVERHEAD = 14
_MAGIC_OFFSET = 16

# RecordBatch v2 (KIP-98):
# baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8,
# crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64,
# maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence int32,
# records count int32
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_V2_HEADER_SIZE = _V2_HEADER.size  # 61
_V2_CRC_START = 21  # attributes offset: the CRC-32C covers attributes..end
# Minimal v2 record: length, attributes, timestampDelta, offsetDelta,
# keyLength, valueLength, headerCount, one byte each.
_MIN_V2_RECORD = 7

# Legacy message (Kafka protocol guide "Message Sets"):
# offset int64, messageSize int32, crc uint32, magic int8, attributes int8,
# [timestamp int64 (magic 1)], key bytes(int32 len), value bytes(int32 len)
_LEGACY_V0 = struct.Struct(">qiIbb")  # 18 bytes
_LEGACY_V1 = struct.Struct(">qiIbbq")  # 26 bytes
_LEGACY_MIN_SIZE = {0: 14, 1: 22}  # messageSize minimum per magic

_I32 = struct.Struct(">i")
_I8 = struct.Struct(">b")
_HH = struct.Struct(">hh")
_HI = struct.Struct(">hi")
_LE_U32 = struct.Struct("<I")

_ATTR_CODEC = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


# ---------------------------------------------------------------------------
# Byte rendering
# ---------------------------------------------------------------------------

_WS_DELETE = str.maketrans("", "", "\t\n\r")
_TEXT_ESCAPES = str.maketrans({"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def render_bytes(b: bytes | bytearray | memoryview | None, limit: int | None = 64) -> str:
    """Render bytes for display.

    Printable UTF-8 (tabs and newlines allowed, shown escaped) is shown quoted:
    ``'hello'``; anything else as hex: ``0x00ff``. When the content is longer
    than ``limit`` characters of text (or ``limit`` hex digits) it is cut and
    followed by ``…`` and the total length: ``0x00ff… (1024 B)``. ``None``
    renders as ``null``. ``limit=None`` never truncates (the rendering is then
    lossless). Only the shown prefix is examined to choose text or hex.
    """
    if b is None:
        return "null"
    n = len(b)
    if limit is not None and limit < 1:
        limit = 1
    head = bytes(b if limit is None else b[: limit * 4])
    final = len(head) == n
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=final)
    except UnicodeDecodeError:
        text = None
    if text is not None and text.translate(_WS_DELETE).isprintable():
        if limit is None or (final and len(text) <= limit):
            return "'" + text.translate(_TEXT_ESCAPES) + "'"
        return "'" + text[:limit].translate(_TEXT_ESCAPES) + f"'… ({n} B)"
    if limit is None or n * 2 <= limit:
        return "0x" + bytes(b).hex()
    return "0x" + bytes(b[: max(1, limit // 2)]).hex() + f"… ({n} B)"


# ---------------------------------------------------------------------------
# Data model
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class ControlRecord:
    """Decoded key (and, for ABORT/COMMIT, value) of a control record.

    Attributes:
        version: key schema version (int16).
        type: control type (int16): 0 = ABORT, 1 = COMMIT (KIP-98), others KRaft.
        type_name: ``"ABORT"``, ``"COMMIT"``... or ``"UNKNOWN"``.
        coordinator_epoch: from the EndTransactionMarker value (version int16,
            coordinatorEpoch int32) of ABORT/COMMIT markers, else ``None``.
    """

    version: int
    type: int
    type_name: str
    coordinator_epoch: int | None = None

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "type": self.type,
            "type_name": self.type_name,
            "coordinator_epoch": self.coordinator_epoch,
        }


@dataclass(slots=True)
class Record:
    """One record (v2) or message (v0/v1).

    Attributes:
        offset: absolute offset (baseOffset + offsetDelta for v2; for inner
            messages of a magic-1 wrapper, rebased from relative offsets).
        timestamp: epoch ms (baseTimestamp + timestampDelta, or the batch's
            maxTimestamp / wrapper timestamp under LogAppendTime); ``None`` for
            magic 0.
        key, value: raw bytes, ``None`` for null.
        headers: list of ``(key, value)``; key decoded UTF-8 (invalid bytes
            replaced), value bytes or ``None``. Always empty for magic 0/1.
        attributes: the record's own attributes byte (unused by Kafka for v2).
        control: decoded control key for records of a control batch, else ``None``.
        crc_valid: for v0/v1 messages, whether the message's own CRC-32 matches;
            ``None`` for v2 records (they have no per-record CRC).
    """

    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0
    control: ControlRecord | None = None
    crc_valid: bool | None = None

    def to_dict(self, limit: int | None = 64) -> dict:
        """JSON-able dict; key/value/header values rendered by :func:`render_bytes`
        (``None`` stays ``None``), with ``key_size``/``value_size`` in bytes
        (``None`` for null)."""
        key, value = self.key, self.value
        return {
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": None if key is None else render_bytes(key, limit),
            "key_size": None if key is None else len(key),
            "value": None if value is None else render_bytes(value, limit),
            "value_size": None if value is None else len(value),
            "headers": [
                {"key": hk, "value": None if hv is None else render_bytes(hv, limit)}
                for hk, hv in self.headers
            ],
            "attributes": self.attributes,
            "control": None if self.control is None else self.control.to_dict(),
            "crc_valid": self.crc_valid,
        }


@dataclass(slots=True)
class RecordBatch:
    """A v2 record batch, or one v0/v1 message (wrapper or plain).

    Header fields keep their wire values; fields a format does not have are
    ``None`` (v0/v1: ``partition_leader_epoch``, ``last_offset_delta``,
    ``producer_id``, ``producer_epoch``, ``base_sequence``; magic 0 also the
    timestamps).

    Attributes:
        position: byte offset of the batch in the records bytes.
        base_offset: int64 at the start (v0/v1: the message's offset field, which
            for a magic-1 wrapper is the offset of its *last* inner message).
        batch_length: int32 length field (bytes after it).
        partition_leader_epoch, magic, crc (uint32 as on the wire), attributes.
        crc_computed: CRC recomputed over the data (CRC-32C over attributes..end
            for v2, CRC-32 over magic..end for v0/v1); ``crc_valid`` = equality.
        last_offset_delta, base_timestamp, max_timestamp (ms), producer_id,
        producer_epoch, base_sequence: v2 header fields (v0/v1: both timestamps
            are the message timestamp).
        record_count: v2: the header's count; v0/v1: number of messages decoded.
        compression: ``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"``.
        timestamp_type: ``"CreateTime"``, ``"LogAppendTime"`` or ``None`` (magic 0).
        is_transactional (attributes bit 4), is_control (bit 5).
        records: decoded :class:`Record` list.
        size_bytes: bytes on the wire (12 + batch_length).
        compressed_size: bytes of the records payload as carried (v2: after the
            61-byte header; v0/v1 wrapper: the value; plain message: size_bytes).
        uncompressed_size: bytes of that payload after decompression (equal to
            compressed_size when uncompressed).
    """

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int | None
    magic: int
    crc: int
    crc_computed: int
    crc_valid: bool
    attributes: int
    last_offset_delta: int | None
    base_timestamp: int | None
    max_timestamp: int | None
    producer_id: int | None
    producer_epoch: int | None
    base_sequence: int | None
    record_count: int
    compression: str
    timestamp_type: str | None
    is_transactional: bool
    is_control: bool
    records: list[Record]
    size_bytes: int
    compressed_size: int
    uncompressed_size: int

    @property
    def last_offset(self) -> int:
        """Offset of the last record: base_offset + last_offset_delta for v2,
        the message offset field for v0/v1."""
        if self.last_offset_delta is None:
            return self.base_offset
        return self.base_offset + self.last_offset_delta

    def to_dict(self, limit: int | None = 64) -> dict:
        """JSON-able dict of every field; records via :meth:`Record.to_dict`."""
        return {
            "position": self.position,
            "base_offset": self.base_offset,
            "batch_length": self.batch_length,
            "partition_leader_epoch": self.partition_leader_epoch,
            "magic": self.magic,
            "crc": self.crc,
            "crc_computed": self.crc_computed,
            "crc_valid": self.crc_valid,
            "attributes": self.attributes,
            "compression": self.compression,
            "timestamp_type": self.timestamp_type,
            "is_transactional": self.is_transactional,
            "is_control": self.is_control,
            "last_offset_delta": self.last_offset_delta,
            "base_timestamp": self.base_timestamp,
            "max_timestamp": self.max_timestamp,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "base_sequence": self.base_sequence,
            "record_count": self.record_count,
            "size_bytes": self.size_bytes,
            "compressed_size": self.compressed_size,
            "uncompressed_size": self.uncompressed_size,
            "records": [r.to_dict(limit) for r in self.records],
        }


@dataclass(slots=True)
class Partial:
    """A truncated batch at the end of the data (normal at the end of a Fetch).

    Attributes:
        offset: byte offset of the truncated batch in the records bytes.
        available: bytes present from ``offset`` to the end.
        needed: total bytes of the batch (12 + batchLength), or ``None`` when
            fewer than 12 bytes are present so the length is unknown.
    """

    offset: int
    available: int
    needed: int | None

    def to_dict(self) -> dict:
        return {"offset": self.offset, "available": self.available, "needed": self.needed}


@dataclass(slots=True)
class RecordSet:
    """The decoded content of one ``records`` field.

    Attributes:
        batches: complete batches in wire order.
        partial: trailing truncated batch, or ``None``.
        size_bytes: length of the input bytes.
        is_null: the field was null (``None`` input).
    """

    batches: list[RecordBatch] = field(default_factory=list)
    partial: Partial | None = None
    size_bytes: int = 0
    is_null: bool = False

    @property
    def record_count(self) -> int:
        """Number of decoded records over all batches."""
        return sum(len(b.records) for b in self.batches)

    def iter_records(self) -> Iterator[Record]:
        """All records of all batches, in order."""
        for b in self.batches:
            yield from b.records

    def to_dict(self, limit: int | None = 64) -> dict:
        """JSON-able dict: ``batches``, ``partial``, ``record_count``,
        ``size_bytes``, ``is_null``."""
        return {
            "batches": [b.to_dict(limit) for b in self.batches],
            "partial": None if self.partial is None else self.partial.to_dict(),
            "record_count": self.record_count,
            "size_bytes": self.size_bytes,
            "is_null": self.is_null,
        }


class RecordSummary(NamedTuple):
    """Per-``records``-field figures for a flow table."""

    record_count: int
    #: compression names seen (``"none"`` included when present)
    compressions: frozenset[str]
    #: wire bytes of the field (including a trailing partial batch)
    bytes: int


def summarize(record_set: RecordSet) -> RecordSummary:
    """``(record_count, compressions, bytes)`` of a decoded :class:`RecordSet`."""
    return RecordSummary(
        record_set.record_count,
        frozenset(b.compression for b in record_set.batches),
        record_set.size_bytes,
    )


class BatchScan(NamedTuple):
    """Figures read from record batch headers alone (:func:`scan_batches`)."""

    #: records as the batch headers count them
    record_count: int
    batches: int
    #: compression names seen (``"none"`` included when present)
    compressions: frozenset[str]
    #: the data ends in a truncated batch (as Fetch responses may)
    partial: bool


_V2_ATTRS_COUNT = struct.Struct(">h")
_V2_COUNT_OFFSET = 57


def scan_batches(data: bytes | memoryview | None) -> BatchScan | None:
    """Count records, batches and compressions of a ``records`` field from the
    magic v2 batch headers only: no CRC check, no decompression, no record parsing
    (for live views; :func:`decode_records` checks everything). ``None`` when a
    legacy message set (magic 0/1) is met, whose records can only be counted by
    decompressing them.

    Raises:
        DecodeError: a batch length below the minimum, an unsupported magic or
            compression, or a negative record count.
    """
    if not data:
        return BatchScan(0, 0, frozenset(), False)
    n = len(data)
    pos = 0
    count = batches = 0
    names: set[str] = set()
    while pos < n:  # the same checks, in the same order, as the decoder's
        left = n - pos
        if left < _LOG_OVERHEAD:
            return BatchScan(count, batches, frozenset(names), True)
        (blen,) = _I32.unpack_from(data, pos + 8)
        path = f"batches[{batches}]"
        if blen < _MIN_RECORD_OVERHEAD:
            raise DecodeError(f"batch length {blen} below the minimum {_MIN_RECORD_OVERHEAD}",
                              offset=pos + 8, expected="batch length (int32)", path=path)
        if _LOG_OVERHEAD + blen > left:
            return BatchScan(count, batches, frozenset(names), True)
        magic = data[pos + _MAGIC_OFFSET]
        if magic in (0, 1):
            return None
        if magic != 2:
            raise DecodeError(f"unsupported magic {magic}", offset=pos + _MAGIC_OFFSET,
                              expected="magic 0, 1 or 2", path=path)
        if _LOG_OVERHEAD + blen < _V2_HEADER_SIZE:
            raise DecodeError(f"batch length {blen} too short for the 61-byte v2 header",
                              offset=pos + 8, expected="record batch header (61 bytes)",
                              path=path)
        (attrs,) = _V2_ATTRS_COUNT.unpack_from(data, pos + _V2_CRC_START)
        codec = attrs & _ATTR_CODEC
        if codec not in COMPRESSION_NAMES:
            raise DecodeError(f"unknown compression type {codec}", offset=pos + _V2_CRC_START,
                              expected="compression 0-4", path=f"batches[{batches}]")
        (k,) = _I32.unpack_from(data, pos + _V2_COUNT_OFFSET)
        if k < 0:
            raise DecodeError(f"invalid record count {k}", offset=pos + _V2_COUNT_OFFSET,
                              expected="record count (int32)", path=f"batches[{batches}]")
        payload = _LOG_OVERHEAD + blen - _V2_HEADER_SIZE
        if codec == 0 and k > payload // _MIN_V2_RECORD:  # as the decoder checks it
            raise DecodeError(f"record count {k} impossible in {payload} bytes",
                              offset=pos + _V2_COUNT_OFFSET, expected="record count (int32)",
                              path=f"batches[{batches}]")
        count += k
        batches += 1
        names.add(COMPRESSION_NAMES[codec])
        pos += _LOG_OVERHEAD + blen
    return BatchScan(count, batches, frozenset(names), False)


# ---------------------------------------------------------------------------
# Internal failure signalling
# ---------------------------------------------------------------------------


class _Fail(Exception):
    """Raised by inner loops; converted to DecodeError with context."""

    def __init__(self, reason: str, pos: int):
        self.reason = reason
        self.pos = pos


class _Corrupt(Exception):
    """Bad compressed data."""


class _TooBig(Exception):
    """Decompressed output over the budget."""


def _varint(buf: bytes, pos: int, end: int, maxbytes: int) -> tuple[int, int]:
    """Unsigned LEB128 of at most ``maxbytes`` bytes (5 for varint, 10 for
    varlong), masked to 32/64 bits like Java's ``ByteUtils``; returns
    ``(raw unsigned value, next pos)``. Callers apply the zigzag decoding."""
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Fail("truncated varint", start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & (0xFFFFFFFF if maxbytes == 5 else 0xFFFFFFFFFFFFFFFF), pos
        shift += 7
        if shift >= 7 * maxbytes:
            raise _Fail(f"varint longer than {maxbytes} bytes", start)


# ---------------------------------------------------------------------------
# Decompression
# ---------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_SNAPPY_FRAMED_ID = b"\xff\x06\x00\x00sNaPpY"
_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK_MAX = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


#: the first input slice handed to zlib for one gzip member (doubled while the
#: member goes on)
_GZIP_STEP = 64


def _gunzip(p: memoryview, limit: int) -> bytes:
    """Every member of a gzip stream (Java's GZIPInputStream reads concatenated
    members and ignores junk after the last one), at most ``limit`` bytes.

    Each member is fed to zlib in slices that start small and double, so that what
    zlib copies out as ``unused_data`` at a member's end is at most about the
    member's own size: work linear in the input, even for a payload of thousands of
    tiny members (handing zlib all the rest each time was quadratic: seconds for
    1 MB of empty members, hours for a 100 MB frame)."""
    out = []
    total = 0
    pos = 0
    n = len(p)
    while True:
        d = zlib.decompressobj(31)
        step = _GZIP_STEP
        while not d.eof:
            if pos >= n:
                raise _Corrupt("gzip: truncated stream")
            piece = p[pos : pos + step]
            pos += len(piece)
            step *= 2
            try:
                # limit + 1 - total >= 1: never 0, which zlib takes as "no limit"
                chunk = d.decompress(piece, limit + 1 - total)
            except zlib.error as e:
                raise _Corrupt(f"gzip: {e}") from None
            total += len(chunk)
            out.append(chunk)
            if total > limit:
                raise _TooBig
            # below the limit zlib took the whole piece (no unconsumed_tail)
        pos -= len(d.unused_data)  # the bytes after this member
        if n - pos >= 2 and p[pos : pos + 2] == b"\x1f\x8b":
            continue
        return b"".join(out)


def _snappy_raw(block, limit: int) -> bytes:
    try:
        n = cramjam.snappy.decompress_raw_len(block)
    except Exception as e:  # cramjam.DecompressionError and friends
        raise _Corrupt(f"snappy: {e}") from None
    if n > limit:
        raise _TooBig
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except Exception as e:
        raise _Corrupt(f"snappy: {e}") from None


def _unsnappy(p: memoryview, limit: int) -> bytes:
    n = len(p)
    if n >= 16 and p[:8] == _XERIAL_MAGIC:
        # Java xerial SnappyOutputStream: 16-byte header (magic, version int32,
        # compat int32), then blocks of int32 length + raw snappy bytes.
        parts = []
        total = 0
        pos = 16
        while pos < n:
            if n - pos >= 16 and p[pos : pos + 8] == _XERIAL_MAGIC:
                pos += 16  # concatenated xerial streams
                continue
            if n - pos < 4:
                raise _Corrupt("snappy: truncated xerial block length")
            (blen,) = _I32.unpack_from(p, pos)
            pos += 4
            if blen < 0 or blen > n - pos:
                raise _Corrupt(f"snappy: xerial block length {blen} exceeds the {n - pos} bytes left")
            part = _snappy_raw(p[pos : pos + blen], limit - total)
            total += len(part)
            parts.append(part)
            pos += blen
        return b"".join(parts)
    if n >= 10 and p[:10] == _SNAPPY_FRAMED_ID:
        # Official snappy framing format (not written by Kafka clients, seen in
        # the wild from some): chunks of type(1) + length(3, LE).
        parts = []
        total = 0
        pos = 0
        while pos < n:
            if n - pos < 4:
                raise _Corrupt("snappy: truncated frame chunk header")
            ctype = p[pos]
            clen = p[pos + 1] | (p[pos + 2] << 8) | (p[pos + 3] << 16)
            pos += 4
            if clen > n - pos:
                raise _Corrupt("snappy: frame chunk past end of data")
            chunk = p[pos : pos + clen]
            pos += clen
            if ctype == 0x00 or ctype == 0x01:
                if clen < 4:
                    raise _Corrupt("snappy: frame chunk too short")
                part = (
                    _snappy_raw(chunk[4:], limit - total) if ctype == 0x00 else bytes(chunk[4:])
                )
                total += len(part)
                if total > limit:
                    raise _TooBig
                parts.append(part)
            elif 0x02 <= ctype <= 0x7F:
                raise _Corrupt(f"snappy: reserved unskippable frame chunk type {ctype:#x}")
            # 0x80-0xfe skippable/padding, 0xff stream identifier: skip
        return b"".join(parts)
    return _snappy_raw(p, limit)


def _xxh32(data: bytes, seed: int = 0) -> int:
    """Pure-Python XXH32 (used only on lz4 frame descriptors, a few bytes)."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed & m, (seed - p1) & m]
        while i + 16 <= n:
            for j in range(4):
                (k,) = _LE_U32.unpack_from(data, i + 4 * j)
                v[j] = (rotl((v[j] + k * p2) & m, 13) * p1) & m
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        (k,) = _LE_U32.unpack_from(data, i)
        h = (rotl((h + k * p3) & m, 17) * p4) & m
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & m, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


def _grow_decompress(fn, payload, hint: int, limit: int, name: str) -> bytes:
    """Run cramjam ``decompress_into`` with a growing output buffer, never larger
    than ``limit + 1`` bytes (cramjam stops writing when the buffer is full)."""
    cap = limit + 1
    size = min(cap, max(hint, 4096))
    while True:
        buf = bytearray(size)
        try:
            n = fn(payload, buf)
        except Exception as e:
            if "failed to write whole buffer" in str(e):
                n = size  # output buffer full
            else:
                raise _Corrupt(f"{name}: {e}") from None
        if n < size:
            return bytes(memoryview(buf)[:n])
        if size >= cap:
            raise _TooBig
        size = min(cap, size * 4)


def _unlz4(p: memoryview, limit: int) -> bytes:
    """LZ4 frame format; header checksum ignored (KAFKA-3160), block and
    content checksums skipped (the batch CRC covers the data)."""
    n = len(p)
    pos = 0
    out = bytearray()
    scratch = None
    while pos < n:
        if n - pos < 4:
            raise _Corrupt("lz4: truncated frame magic")
        (magic,) = _LE_U32.unpack_from(p, pos)
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            if n - pos < 8:
                raise _Corrupt("lz4: truncated skippable frame")
            (slen,) = _LE_U32.unpack_from(p, pos + 4)
            pos += 8 + slen
            continue
        if magic != _LZ4_MAGIC:
            raise _Corrupt(f"lz4: bad frame magic {magic:#010x}")
        if n - pos < 7:
            raise _Corrupt("lz4: truncated frame descriptor")
        frame_start = pos
        flg = p[pos + 4]
        bd = p[pos + 5]
        if flg >> 6 != 1:
            raise _Corrupt(f"lz4: unsupported frame version {flg >> 6}")
        independent = flg & 0x20
        block_checksum = 4 if flg & 0x10 else 0
        content_checksum = 4 if flg & 0x04 else 0
        desc_end = pos + 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
        if desc_end + 1 > n:
            raise _Corrupt("lz4: truncated frame descriptor")
        block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7, 1 << 22)
        if not independent:
            # Linked blocks (not written by Kafka clients): let cramjam decode the
            # whole frame after fixing the header checksum.
            fixed = bytearray(p[frame_start:])
            hc_pos = desc_end - frame_start
            fixed[hc_pos] = (_xxh32(bytes(fixed[4:hc_pos])) >> 8) & 0xFF
            out += _grow_decompress(
                cramjam.lz4.decompress_into, bytes(fixed), 4 * len(fixed), limit - len(out), "lz4"
            )
            return bytes(out)
        pos = desc_end + 1
        while True:
            if n - pos < 4:
                raise _Corrupt("lz4: truncated block size")
            (bsize,) = _LE_U32.unpack_from(p, pos)
            pos += 4
            if bsize == 0:  # EndMark
                pos += content_checksum
                if pos > n:  # a missing content checksum is tolerated
                    pos = n
                break
            raw = bsize & 0x80000000
            bsize &= 0x7FFFFFFF
            if bsize > n - pos:
                raise _Corrupt(f"lz4: block size {bsize} exceeds the {n - pos} bytes left")
            block = p[pos : pos + bsize]
            pos += bsize + block_checksum
            if raw:
                if len(out) + bsize > limit:
                    raise _TooBig
                out += block
                continue
            if scratch is None or len(scratch) < block_max:
                scratch = bytearray(block_max)
            try:
                m = cramjam.lz4.decompress_block_into(block, scratch)
            except Exception as e:
                raise _Corrupt(f"lz4: {e}") from None
            if len(out) + m > limit:
                raise _TooBig
            out += memoryview(scratch)[:m]
    return bytes(out)


def _zstd_content_size(p: memoryview) -> int | None:
    if len(p) < 6 or p[:4] != _ZSTD_MAGIC:
        return None
    fhd = p[4]
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    if size == 0 or pos + size > len(p):
        return None
    v = int.from_bytes(p[pos : pos + size], "little")
    return v + 256 if size == 2 else v


def _unzstd(p: memoryview, limit: int) -> bytes:
    fcs = _zstd_content_size(p)
    if fcs is not None and fcs > limit:
        raise _TooBig
    hint = fcs + 1 if fcs is not None else 4 * len(p)
    return _grow_decompress(cramjam.zstd.decompress_into, p, hint, limit, "zstd")


_DECOMPRESSORS = {1: _gunzip, 2: _unsnappy, 3: _unlz4, 4: _unzstd}


# ---------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------


def _v2_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_ts: int,
    log_append_ts: int | None,
    is_control: bool,
) -> tuple[list, int]:
    """Parse ``count`` v2 records from ``buf[pos:end]``.

    Raises ``_Fail`` with ``.pos``, ``.what`` and ``.index`` set."""
    records: list = []
    append = records.append
    i = 0
    what = "record length (varint)"
    fpos = pos
    try:
        while i < count:
            # -- length
            what = "record length (varint)"
            fpos = pos
            if pos >= end:
                raise _Fail(f"truncated: {count} records declared, {i} present", pos)
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < end and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, end, 5)
            rlen = (v >> 1) ^ -(v & 1)
            if rlen < 6:
                raise _Fail(f"invalid record length {rlen}", fpos)
            rend = pos + rlen
            if rend > end:
                raise _Fail(f"record length {rlen} exceeds the {end - pos} bytes left in the batch", fpos)
            # -- attributes int8
            what = "record attributes (int8)"
            attrs = buf[pos]
            pos += 1
            # -- timestampDelta varlong
            what = "record timestampDelta (varlong)"
            fpos = pos
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < rend and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, rend, 10)
            ts_delta = (v >> 1) ^ -(v & 1)
            # -- offsetDelta varint
            what = "record offsetDelta (varint)"
            fpos = pos
            if pos >= rend:
                raise _Fail("truncated record", pos)
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < rend and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, rend, 5)
            off_delta = (v >> 1) ^ -(v & 1)
            # -- key
            what = "record key length (varint)"
            fpos = pos
            if pos >= rend:
                raise _Fail("truncated record", pos)
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < rend and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, rend, 5)
            klen = (v >> 1) ^ -(v & 1)
            if klen < 0:
                if klen != -1:
                    raise _Fail(f"invalid key length {klen}", fpos)
                key = None
            else:
                if klen > rend - pos:
                    what = "record key"
                    raise _Fail(f"key length {klen} exceeds the {rend - pos} bytes left in the record", pos)
                key = buf[pos : pos + klen]
                pos += klen
            # -- value
            what = "record value length (varint)"
            fpos = pos
            if pos >= rend:
                raise _Fail("truncated record", pos)
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < rend and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, rend, 5)
            vlen = (v >> 1) ^ -(v & 1)
            if vlen < 0:
                if vlen != -1:
                    raise _Fail(f"invalid value length {vlen}", fpos)
                value = None
            else:
                if vlen > rend - pos:
                    what = "record value"
                    raise _Fail(f"value length {vlen} exceeds the {rend - pos} bytes left in the record", pos)
                value = buf[pos : pos + vlen]
                pos += vlen
            # -- headers
            what = "record header count (varint)"
            fpos = pos
            if pos >= rend:
                raise _Fail("truncated record", pos)
            b = buf[pos]
            if b < 0x80:
                v = b
                pos += 1
            elif pos + 1 < rend and buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(buf, pos, rend, 5)
            hcount = (v >> 1) ^ -(v & 1)
            headers = []
            if hcount:
                if hcount < 0 or hcount * 2 > rend - pos:
                    raise _Fail(
                        f"header count {hcount} impossible in the {rend - pos} bytes left in the record",
                        fpos,
                    )
                for _h in range(hcount):
                    what = "header key length (varint)"
                    fpos = pos
                    hkl, pos = _varint(buf, pos, rend, 5)
                    hkl = (hkl >> 1) ^ -(hkl & 1)
                    if hkl < 0 or hkl > rend - pos:
                        raise _Fail(f"invalid header key length {hkl}", fpos)
                    hkey = buf[pos : pos + hkl].decode("utf-8", "replace")
                    pos += hkl
                    what = "header value length (varint)"
                    fpos = pos
                    hvl, pos = _varint(buf, pos, rend, 5)
                    hvl = (hvl >> 1) ^ -(hvl & 1)
                    if hvl < 0:
                        if hvl != -1:
                            raise _Fail(f"invalid header value length {hvl}", fpos)
                        hval = None
                    else:
                        if hvl > rend - pos:
                            what = "header value"
                            raise _Fail(
                                f"header value length {hvl} exceeds the {rend - pos} bytes left in the record",
                                pos,
                            )
                        hval = buf[pos : pos + hvl]
                        pos += hvl
                    headers.append((hkey, hval))
            if pos != rend:
                what = "end of record"
                raise _Fail(
                    f"record length {rlen} does not match its content ({rlen - (rend - pos)} bytes)", pos
                )
            control = None
            if is_control:
                what = "control record key (version int16, type int16)"
                if key is None or len(key) < 4:
                    raise _Fail("control record key shorter than 4 bytes", pos)
                cver, ctype = _HH.unpack_from(key)
                epoch = None
                if ctype in (0, 1) and value is not None and len(value) >= 6:
                    epoch = _HI.unpack_from(value)[1]
                control = ControlRecord(cver, ctype, CONTROL_TYPES.get(ctype, "UNKNOWN"), epoch)
            append(
                Record(
                    base_offset + off_delta,
                    log_append_ts if log_append_ts is not None else base_ts + ts_delta,
                    key,
                    value,
                    headers,
                    attrs,
                    control,
                )
            )
            i += 1
    except _Fail as f:
        f.what = what  # type: ignore[attr-defined]
        f.index = i  # type: ignore[attr-defined]
        raise
    except IndexError:  # pragma: no cover - defensive; bounds are checked above
        f = _Fail("truncated record", pos)
        f.what = what  # type: ignore[attr-defined]
        f.index = i  # type: ignore[attr-defined]
        raise f from None
    return records, pos


def _legacy_message(buf: bytes, pos: int, end: int):
    """Parse one v0/v1 message-set entry at ``pos`` that must fit in ``end``.

    Returns (offset, size, crc, crc_computed, magic, attrs, timestamp, key,
    value, value_pos, msg_end). Raises ``_Fail`` with ``.what``."""
    what = "message offset and size (int64, int32)"
    try:
        if end - pos < _LOG_OVERHEAD:
            raise _Fail(f"truncated message: {end - pos} bytes left", pos)
        (size,) = _I32.unpack_from(buf, pos + 8)
        if size < _MIN_RECORD_OVERHEAD:
            raise _Fail(f"message size {size} below the minimum {_MIN_RECORD_OVERHEAD}", pos + 8)
        msg_end = pos + _LOG_OVERHEAD + size
        if msg_end > end:
            raise _Fail(f"message size {size} exceeds the {end - pos - _LOG_OVERHEAD} bytes left", pos + 8)
        what = "message magic (int8)"
        magic = buf[pos + _MAGIC_OFFSET]
        if magic == 0:
            offset, _, crc, _, attrs = _LEGACY_V0.unpack_from(buf, pos)
            timestamp = None
            kpos = pos + _LEGACY_V0.size
        elif magic == 1:
            if size < _LEGACY_MIN_SIZE[1]:
                raise _Fail(f"message size {size} below the magic 1 minimum 22", pos + 8)
            offset, _, crc, _, attrs, timestamp = _LEGACY_V1.unpack_from(buf, pos)
            kpos = pos + _LEGACY_V1.size
        else:
            raise _Fail(f"magic {magic} inside a legacy message set", pos + _MAGIC_OFFSET)
        attrs &= 0xFF
        what = "message key length (int32)"
        if msg_end - kpos < 4:
            raise _Fail("truncated message", kpos)
        (klen,) = _I32.unpack_from(buf, kpos)
        kpos += 4
        if klen < 0:
            if klen != -1:
                raise _Fail(f"invalid key length {klen}", kpos - 4)
            key = None
        else:
            if klen > msg_end - kpos:
                raise _Fail(f"key length {klen} exceeds the {msg_end - kpos} bytes left in the message", kpos - 4)
            key = buf[kpos : kpos + klen]
            kpos += klen
        what = "message value length (int32)"
        if msg_end - kpos < 4:
            raise _Fail("truncated message", kpos)
        (vlen,) = _I32.unpack_from(buf, kpos)
        kpos += 4
        vpos = kpos
        if vlen < 0:
            if vlen != -1:
                raise _Fail(f"invalid value length {vlen}", kpos - 4)
            value = None
        else:
            if vlen > msg_end - kpos:
                raise _Fail(
                    f"value length {vlen} exceeds the {msg_end - kpos} bytes left in the message", kpos - 4
                )
            value = buf[kpos : kpos + vlen]
            kpos += vlen
        if kpos != msg_end:
            what = "end of message"
            raise _Fail(f"{msg_end - kpos} bytes after the message value", kpos)
    except _Fail as f:
        f.what = what  # type: ignore[attr-defined]
        raise
    crc_computed = zlib.crc32(memoryview(buf)[pos + _MAGIC_OFFSET : msg_end])
    return offset, size, crc, crc_computed, magic, attrs, timestamp, key, value, vpos, msg_end


class _Decoder:
    __slots__ = ("data", "mv", "budget", "records_left", "max_records")

    def __init__(self, data: bytes, max_decompressed: int, max_records: int):
        self.data = data
        self.mv = memoryview(data)
        self.budget = max_decompressed
        # uncompressed, the bytes bound the records already (7 bytes each at least)
        self.max_records = max(max_records, len(data) // _MIN_V2_RECORD)
        self.records_left = self.max_records

    def _take_records(self, n: int, offset: int, path: str) -> None:
        if n > self.records_left:
            raise self._error(
                f"more than {self.max_records} records in one records field (max_records)",
                offset,
                "records within max_records",
                path,
            )
        self.records_left -= n

    # -- helpers ---------------------------------------------------------
    def _error(self, reason: str, offset: int, expected: str, path: str) -> DecodeError:
        return DecodeError(reason, offset=offset, expected=expected, path=path)

    def _decompress(self, codec: int, start: int, end: int, path: str, crc_valid: bool) -> bytes:
        name = COMPRESSION_NAMES[codec]
        try:
            out = _DECOMPRESSORS[codec](self.mv[start:end], self.budget)
        except _TooBig:
            raise self._error(
                f"{name} payload decompresses past the max_decompressed budget "
                f"({self.budget} bytes left)",
                start,
                f"{name} payload",
                path,
            ) from None
        except _Corrupt as e:
            reason = f"corrupt {name} payload: {e}"
            if not crc_valid:
                reason += " (batch CRC mismatch)"
            raise self._error(reason, start, f"{name} payload", path) from None
        except (MemoryError, OverflowError, ValueError, TypeError) as e:  # defensive
            raise self._error(f"corrupt {name} payload: {e}", start, f"{name} payload", path) from None
        self.budget -= len(out)
        return out

    # -- top level -------------------------------------------------------
    def run(self) -> RecordSet:
        data = self.data
        n = len(data)
        rs = RecordSet(size_bytes=n)
        batches = rs.batches
        pos = 0
        while pos < n:
            path = f"batches[{len(batches)}]"
            left = n - pos
            if left < _LOG_OVERHEAD:
                rs.partial = Partial(pos, left, None)
                break
            (blen,) = _I32.unpack_from(data, pos + 8)
            if blen < _MIN_RECORD_OVERHEAD:
                raise self._error(
                    f"batch length {blen} below the minimum {_MIN_RECORD_OVERHEAD}",
                    pos + 8,
                    "batch length (int32)",
                    path,
                )
            total = _LOG_OVERHEAD + blen
            if total > left:
                rs.partial = Partial(pos, left, total)
                break
            (magic,) = _I8.unpack_from(data, pos + _MAGIC_OFFSET)
            if magic == 2:
                batches.append(self._v2_batch(pos, pos + total, path))
            elif magic == 0 or magic == 1:
                batches.append(self._legacy_batch(pos, pos + total, path))
            else:
                raise self._error(f"unsupported magic {magic}", pos + _MAGIC_OFFSET, "magic 0, 1 or 2", path)
            pos += total
        return rs

    def _v2_batch(self, pos: int, end: int, path: str) -> RecordBatch:
        data = self.data
        if end - pos < _V2_HEADER_SIZE:
            raise self._error(
                f"batch length {end - pos - _LOG_OVERHEAD} too short for the 61-byte v2 header",
                pos + 8,
                "record batch header (61 bytes)",
                path,
            )
        (
            base_offset,
            blen,
            ple,
            magic,
            crc,
            attrs,
            last_delta,
            base_ts,
            max_ts,
            pid,
            pepoch,
            bseq,
            count,
        ) = _V2_HEADER.unpack_from(data, pos)
        crc_computed = _crc32c(self.mv[pos + _V2_CRC_START : end])
        crc_valid = crc_computed == crc
        codec = attrs & _ATTR_CODEC
        if codec not in COMPRESSION_NAMES:
            raise self._error(f"unknown compression type {codec}", pos + _V2_CRC_START, "compression 0-4", path)
        is_control = bool(attrs & _ATTR_CONTROL)
        log_append = bool(attrs & _ATTR_TIMESTAMP_TYPE)
        payload_start = pos + _V2_HEADER_SIZE
        payload_size = end - payload_start
        if count < 0:
            raise self._error(f"invalid record count {count}", payload_start - 4, "record count (int32)", path)
        if codec == 0:
            buf, rpos, rend = data, payload_start, end
        elif payload_size == 0 and count == 0:
            buf, rpos, rend = b"", 0, 0
        else:
            buf = self._decompress(codec, payload_start, end, path, crc_valid)
            rpos, rend = 0, len(buf)
        if count > (rend - rpos) // _MIN_V2_RECORD:
            where = "" if codec == 0 else f" of decompressed {COMPRESSION_NAMES[codec]} payload"
            reason = f"record count {count} impossible in {rend - rpos} bytes{where}"
            if not crc_valid:
                reason += " (batch CRC mismatch)"
            raise self._error(reason, payload_start - 4, "record count (int32)", path)
        self._take_records(count, payload_start - 4, path)
        try:
            records, rpos = _v2_records(
                buf, rpos, rend, count, base_offset, base_ts, max_ts if log_append else None, is_control
            )
        except _Fail as f:
            reason = f.reason
            if codec == 0:
                offset = f.pos
            else:
                offset = payload_start
                reason += f" (at byte {f.pos} of the decompressed {COMPRESSION_NAMES[codec]} payload)"
            if not crc_valid:
                reason += " (batch CRC mismatch)"
            raise self._error(reason, offset, f.what, f"{path}.records[{f.index}]") from None
        if rpos != rend:
            reason = f"{rend - rpos} bytes left after the {count} declared records"
            offset = rpos
            if codec != 0:
                offset = payload_start
                reason += f" (at byte {rpos} of the decompressed {COMPRESSION_NAMES[codec]} payload)"
            if not crc_valid:
                reason += " (batch CRC mismatch)"
            raise self._error(reason, offset, "end of record batch", path)
        return RecordBatch(
            position=pos,
            base_offset=base_offset,
            batch_length=blen,
            partition_leader_epoch=ple,
            magic=magic,
            crc=crc,
            crc_computed=crc_computed,
            crc_valid=crc_valid,
            attributes=attrs,
            last_offset_delta=last_delta,
            base_timestamp=base_ts,
            max_timestamp=max_ts,
            producer_id=pid,
            producer_epoch=pepoch,
            base_sequence=bseq,
            record_count=count,
            compression=COMPRESSION_NAMES[codec],
            timestamp_type=_TIMESTAMP_TYPES[log_append],
            is_transactional=bool(attrs & _ATTR_TRANSACTIONAL),
            is_control=is_control,
            records=records,
            size_bytes=end - pos,
            compressed_size=payload_size,
            uncompressed_size=rend if codec else payload_size,
        )

    def _legacy_batch(self, pos: int, end: int, path: str) -> RecordBatch:
        data = self.data
        try:
            (offset, size, crc, crc_computed, magic, attrs, ts, key, value, vpos, _) = _legacy_message(
                data, pos, end
            )
        except _Fail as f:
            raise self._error(f.reason, f.pos, f.what, path) from None
        crc_valid = crc == crc_computed
        codec = attrs & _ATTR_CODEC
        log_append = magic == 1 and bool(attrs & _ATTR_TIMESTAMP_TYPE)
        timestamp_type = None if magic == 0 else _TIMESTAMP_TYPES[log_append]
        if codec == 0:
            records = [Record(offset, ts, key, value, [], attrs, None, crc_valid)]
            compressed_size = uncompressed_size = end - pos
        else:
            if codec not in (1, 2, 3):
                raise self._error(
                    f"compression type {codec} is not valid for magic {magic}",
                    pos + _MAGIC_OFFSET + 1,
                    "compression 0-3 (gzip, snappy, lz4)",
                    path,
                )
            if value is None:
                raise self._error(
                    "compressed wrapper message has a null value", vpos - 4, "compressed message set", path
                )
            inner = self._decompress(codec, vpos, vpos + len(value), path, crc_valid)
            compressed_size = len(value)
            uncompressed_size = len(inner)
            records = []
            ipos = 0
            iend = len(inner)
            cname = COMPRESSION_NAMES[codec]
            while ipos < iend:
                try:
                    (ioff, _, icrc, icrc_c, imagic, iattrs, its, ikey, ival, _, ipos_next) = _legacy_message(
                        inner, ipos, iend
                    )
                except _Fail as f:
                    reason = f"{f.reason} (at byte {f.pos} of the decompressed {cname} message set)"
                    if not crc_valid:
                        reason += " (wrapper CRC mismatch)"
                    raise self._error(reason, vpos, f.what, f"{path}.records[{len(records)}]") from None
                if iattrs & _ATTR_CODEC:
                    raise self._error(
                        f"nested compression (at byte {ipos} of the decompressed {cname} message set)",
                        vpos,
                        "uncompressed inner message",
                        f"{path}.records[{len(records)}]",
                    )
                if log_append:
                    its = ts
                self._take_records(1, vpos, f"{path}.records[{len(records)}]")
                records.append(Record(ioff, its, ikey, ival, [], iattrs, None, icrc == icrc_c))
                ipos = ipos_next
            if not records:
                raise self._error(
                    "compressed wrapper message holds no inner messages",
                    vpos,
                    "compressed message set",
                    path,
                )
            if magic > 0 and offset != 0:
                # Magic 1 wrappers carry the absolute offset of the last inner
                # message and inner offsets are relative (KIP-31). An outer
                # offset of 0 (produce data from some clients) means "as is",
                # as in Kafka's AbstractLegacyRecordBatch.
                last_inner = records[-1].offset
                if offset < last_inner:
                    raise self._error(
                        f"wrapper offset {offset} is less than the last inner offset {last_inner}",
                        pos,
                        "wrapper offset >= last inner relative offset",
                        path,
                    )
                base = offset - last_inner
                for r in records:
                    r.offset += base
        return RecordBatch(
            position=pos,
            base_offset=offset,
            batch_length=size,
            partition_leader_epoch=None,
            magic=magic,
            crc=crc,
            crc_computed=crc_computed,
            crc_valid=crc_valid,
            attributes=attrs,
            last_offset_delta=None,
            base_timestamp=ts,
            max_timestamp=ts,
            producer_id=None,
            producer_epoch=None,
            base_sequence=None,
            record_count=len(records),
            compression=COMPRESSION_NAMES[codec],
            timestamp_type=timestamp_type,
            is_transactional=False,
            is_control=False,
            records=records,
            size_bytes=end - pos,
            compressed_size=compressed_size,
            uncompressed_size=uncompressed_size,
        )


def decode_records(
    data: bytes | bytearray | memoryview | None,
    *,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    max_records: int = DEFAULT_MAX_RECORDS,
) -> RecordSet:
    """Decode a Kafka ``records`` field.

    Args:
        data: the field's bytes (any mix of v2 record batches and v0/v1 message
            set entries), or ``None`` for a null field.
        max_decompressed: cap on the total bytes all compressed payloads of this
            call may decompress to (default 64 MiB); exceeding it raises
            :class:`DecodeError` (decompression-bomb guard).
        max_records: cap on the records this call builds (default 200,000), raised
            to what ``data`` could hold uncompressed (a record takes 7 bytes at
            least); more is a :class:`DecodeError` before they are built (a small
            compressed payload of empty records must not cost gigabytes of objects).

    Returns:
        A :class:`RecordSet`. A truncated last batch becomes ``partial``.

    Raises:
        DecodeError: malformed data (bad lengths, varints, counts, corrupt or
            oversized compressed payloads, unknown magic or codec). ``offset`` is
            relative to the start of ``data``; see the module docstring.
        TypeError: ``data`` is not bytes-like or ``None``.

    Formats: KIP-98 / Kafka protocol guide "Record Batch" (magic 2) and
    "Message Sets" (magic 0 and 1).
    """
    if max_decompressed < 0 or max_records < 0:
        raise ValueError("max_decompressed and max_records must be >= 0")
    if data is None:
        return RecordSet(is_null=True)
    if not isinstance(data, bytes):
        if not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"records data must be bytes-like or None, not {type(data).__name__}")
        data = bytes(data)
    return _Decoder(data, max_decompressed, max_records).run()
