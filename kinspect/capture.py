"""Capture files: record what crossed the proxy, read it back, rebuild flows.

Format (JSON Lines, gzip-compressed when the path ends with ``.gz``; the contract
shared by ``kinspect proxy --capture``, ``show``, ``export``, replay and analysis):

* line 1, and the first line of every rotated part::

    {"type": "session", "kinspect": "0.1.0", "start_ns": <int>, "upstream": "h:p",
     "listen": "h:p", "specs": [{"path": ..., "origin": ...}], "part": <int>,
     "secrets": <bool>, "redaction_marker": "<kinspect:redacted>"}

* one line per frame, in the order the proxy handled them::

    {"type": "frame", "ts_ns": <time.time_ns()>, "conn": <int>, "dir": "req"|"resp",
     "client": "h:p", "upstream": "h:p", "flow": <int>, "api_key": <int>,
     "api_version": <int>, "correlation_id": <int>, "frame": "<base64>",
     ["frame_sent": "<base64>"], ["flags": [...]], ["notes": [...]], ["redacted": true]}

  ``frame`` is the frame as received (without the 4-byte size prefix);
  ``frame_sent`` the bytes actually forwarded when they differ (address
  rewriting, mutation). ``api_key`` is -1 for raw SASL tokens and unpaired
  responses. ``notes``: what the proxy noted on the flow so far, in order (the
  rules that changed a frame, why rules or a rewrite were not applied); a response
  line repeats its request line's.
* connection lines: ``{"type": "conn", "event": "open"|"close", "ts_ns", "conn",
  "client", "upstream"}``.

Readers ignore unknown ``type`` values, extra keys and blank lines. On frame and
conn lines, ``conn``, ``flow``, ``api_key``, ``api_version`` and ``correlation_id``
hold JSON integers when present (of 64 bits; 32 for the last three) and ``ts_ns`` a
64-bit integer or ``null`` (not known, as when it is absent); any other value is a
:class:`CaptureError` naming the file and line, for every reader (``show``,
``export``, ``replay``, ``serve``, ``analyze``; ``kinspect decode --jsonl`` makes such
a line an error line).

Writers: :class:`CaptureWriter` writes in-process (library use, tests);
``kinspect proxy --capture`` uses :class:`~kinspect.capture_process.CaptureProcess`,
which runs a ``CaptureWriter`` in a child process (same bytes, off the event loop).

Crash safety: lines are buffered whole and written in batches of whole lines
(every :attr:`CaptureWriter.flush_lines` lines or
:attr:`CaptureWriter.flush_bytes` bytes, after at most
:attr:`CaptureWriter.flush_interval` seconds, and on close), so a crash can only
leave a torn *last* line, which :func:`read_capture` skips with a warning. An
uncompressed capture on a file system that takes ``O_DIRECT`` (ext4, XFS, and
others) is written past the page cache instead
(:class:`~kinspect.pagecache.DirectAppender`): lines go out in whole 4 KiB blocks as
4 MiB of them gather, and the rest at most ``flush_interval`` seconds after it was
buffered, and on close. A crash, or a reader while the capture is being written,
may then also find a torn last line, and nothing else.

A write error (a full disk, ``EIO``) ends the capture where it stands: the part
being written is cut back to its last whole line (a gzip part is ended at its last
flush, trailer included), nothing more is written, and the error is raised once,
naming the file.

Rotation (``--capture-max-bytes N``): when the JSON bytes written to the current
part (counted before gzip) would pass ``N``, a new part is started (a part holds at
least one line after its session line, so a single larger line still fits):
``cap.jsonl``, ``cap.1.jsonl``, ``cap.2.jsonl``... (``cap.1.jsonl.gz`` for gzip).
Every part starts with its own session line (same ``start_ns``, its ``part``
number). :func:`read_capture` follows the parts of a capture in order.

Redaction (default; ``--capture-secrets`` turns it off): secrets are replaced by
the **redaction marker**, the ASCII bytes of ``<kinspect:redacted>`` repeated and
cut to exactly the length of the secret, so every length field and the frame
size stay as they were and the frame still decodes:

* SaslAuthenticate (api key 36) ``AuthBytes``, in requests and responses;
* raw SASL tokens after SaslHandshake v0 (flow flag ``sasl``): the whole frame;
* responses to no known request (flow flag ``unpaired``, api key -1: what they
  answer, hence what they hold, is unknown): everything past the correlation id;
* AlterUserScramCredentials (51) ``Salt``/``SaltedPassword``; the delegation-token
  ``Hmac`` of CreateDelegationToken (38), RenewDelegationToken (39),
  ExpireDelegationToken (40) and DescribeDelegationToken (41);
* config values whose names look secret (``*password*``, ``*secret*``, ``*jaas*``,
  ``*credential*``, ``*token*``, ``*.key``) in CreateTopics (19), DescribeConfigs (32),
  AlterConfigs (33) and IncrementalAlterConfigs (44).

Fields are re-encoded with the codec. A frame that does not decode is redacted
whole past its header (request: after api key, version and correlation id;
response: after the correlation id). Redacted lines carry ``"redacted": true``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import errno
import gzip
import json
import logging
import os
import re
import stat
import struct
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from orjson import loads as _orjson_loads

from . import __version__
from .codec import DEFAULT_MAX_FRAME, Codec, DecodeError, KinspectError
from .codec.errors import EncodeError
from .flows import (
    CLOSED,
    NO_RESPONSE,
    REDACTED,
    REDACTED_REQUEST,
    SASL_TOKEN,
    UNPAIRED,
    UNTIMED,
    Flow,
)
from .pagecache import DirectAppender, DropBehind
from .units import parse_size

try:  # SIMD base64 (some 30x binascii's speed): frames are most of a capture's bytes
    from pybase64 import b64decode as _b64decode
    from pybase64 import b64encode as _b64encode
except ImportError:  # pragma: no cover - pybase64 is a dependency
    _b64decode = base64.b64decode

    def _b64encode(b: Any) -> bytes:
        return binascii.b2a_base64(b, newline=False)

log = logging.getLogger("kinspect.capture")

__all__ = [
    "REDACTION_MARKER", "REDACTED_FIELDS", "DEFAULT_DIR", "CaptureError", "CaptureWarning",
    "CaptureWriter", "Capture", "FrameRef", "redaction_marker", "redact_frame",
    "capture_parts", "part_path", "read_capture", "load_capture", "flows_from_records",
    "make_parent", "add_capture_options", "capture_addon_from_args", "resolve_capture_path",
]

#: The redaction marker, repeated and cut to the length of each secret.
REDACTION_MARKER = b"<kinspect:redacted>"

#: ``api_key -> field names`` redacted wherever they occur (request and response).
REDACTED_FIELDS: dict[int, frozenset[str]] = {
    36: frozenset({"AuthBytes"}),                   # SaslAuthenticate (KIP-152)
    38: frozenset({"Hmac"}),                        # CreateDelegationToken
    39: frozenset({"Hmac"}),                        # RenewDelegationToken
    40: frozenset({"Hmac"}),                        # ExpireDelegationToken
    41: frozenset({"Hmac"}),                        # DescribeDelegationToken
    51: frozenset({"Salt", "SaltedPassword"}),      # AlterUserScramCredentials (KIP-554)
}

#: APIs carrying config entries (a ``Name`` and a string ``Value`` side by side):
#: CreateTopics, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs.
CONFIG_APIS = frozenset({19, 32, 33, 44})
#: Config names whose values are redacted in those APIs (passwords, JAAS, keys...).
SENSITIVE_CONFIG = re.compile(r"password|secret|jaas|credential|token|\.key$|keystore\.key",
                              re.IGNORECASE)

#: Where a capture file named without a directory goes.
DEFAULT_DIR = Path("captures")


class CaptureError(KinspectError):
    """A capture file that cannot be read (not JSON Lines, a corrupt line that is
    not the last one, a missing file). ``path`` and ``line`` (1-based) say where;
    ``record`` (1-based), for records that came from no file
    (:func:`flows_from_records` given a list), says which one."""

    def __init__(self, reason: str, path: str | os.PathLike | None = None,
                 line: int | None = None, record: int | None = None):
        self.reason = reason
        self.path = None if path is None else str(path)
        self.line = line
        self.record = record
        where = self.path or "<capture>"
        if line is not None:
            where += f":{line}"
        elif record is not None:
            where += f": record {record}"
        super().__init__(f"{where}: {reason}")


class CaptureWarning(UserWarning):
    """A recoverable problem in a capture file (a torn last line)."""


# ---------------------------------------------------------------------------
# Redaction
# ---------------------------------------------------------------------------

def redaction_marker(n: int) -> bytes:
    """``n`` bytes of :data:`REDACTION_MARKER` repeated (``b"<kinspect:redacted><kin..."``)."""
    m = REDACTION_MARKER
    return (m * (n // len(m) + 1))[:n]


def _redact_struct(value: Any, names: frozenset[str]) -> int:
    """Replace every bytes field named in ``names`` (recursively); return how many."""
    count = 0
    spec = getattr(value, "_spec", None)
    if spec is None:
        return 0
    if _sensitive_config(value):
        v = value.Value
        value.Value = redaction_marker(len(v.encode())).decode("ascii")
        count += 1
    for f in spec.fields:
        v = getattr(value, f.name)
        if v is None:
            continue
        if f.name in names and f.type == "bytes":
            setattr(value, f.name, redaction_marker(len(v)))
            count += 1
        elif f.struct is not None:
            for item in (v if f.is_array else [v]):
                count += _redact_struct(item, names)
    return count


def _sensitive_config(value: Any) -> bool:
    name, val = value.get("Name"), value.get("Value")
    return (isinstance(name, str) and isinstance(val, str) and val != ""
            and bool(SENSITIVE_CONFIG.search(name)))


def redact_frame(codec: Codec, frame: bytes, direction: str, api_key: int, api_version: int,
                 *, sasl_token: bool = False) -> bytes | None:
    """The frame with its secrets replaced by the marker, or ``None`` if it holds none.

    Args:
        codec: decodes and re-encodes the frame.
        frame: frame without size prefix.
        direction: ``"req"`` or ``"resp"``.
        api_key, api_version: of the flow (for a response: of its request; -1 for a
            response to no known request, which is redacted past its correlation id).
        sasl_token: the frame is a raw SASL token (SaslHandshake v0): all of it is replaced.

    Returns:
        bytes of the same length as ``frame``, or ``None`` when nothing is secret.
        Never raises for malformed frames (they are redacted past their header).
    """
    if sasl_token:
        return redaction_marker(len(frame))
    if api_key == -1 and direction == "resp":
        # an answer to no known request (unpaired): what it holds cannot be told,
        # a SaslAuthenticate answer among others; only its correlation id is kept
        return None if len(frame) <= 4 else bytes(frame[:4]) + redaction_marker(len(frame) - 4)
    names = REDACTED_FIELDS.get(api_key)
    if not names:
        if api_key not in CONFIG_APIS:
            return None
        names = frozenset()
    frame = bytes(frame)  # (a view into the capture ring, in the capture process)
    try:
        msg = (codec.decode_request(frame) if direction == "req" else
               codec.decode_response(frame, api_key, api_version))
        n = _redact_struct(msg.body, names)
        if msg.trailing:  # (bytes after the body of a frame that may hold secrets: what
            # they are nobody can tell, librdkafka's are fields written out of place)
            msg.trailing = redaction_marker(len(msg.trailing))
            n += 1
        encode = codec.encode_request if direction == "req" else codec.encode_response
        out = encode(msg) if n else None
    except (DecodeError, EncodeError):
        out = b""
    if out is None:
        return None
    if len(out) != len(frame):  # malformed or not re-encodable: hide everything past the header
        keep = 8 if direction == "req" else 4
        keep = min(keep, len(frame))
        return frame[:keep] + redaction_marker(len(frame) - keep)
    return out


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------

def resolve_capture_path(name: str | os.PathLike) -> Path:
    """A capture path as the user wrote it, or under ``captures/`` when it names no
    directory (``"run.jsonl"`` → ``captures/run.jsonl``)."""
    p = Path(name)
    if not p.is_absolute() and p.parent == Path("."):
        return DEFAULT_DIR / p
    return p


def _split_suffix(path: Path) -> tuple[str, str]:
    name = path.name
    for suf in (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".gz"):
        if name.endswith(suf) and len(name) > len(suf):
            return name[: -len(suf)], suf
    stem, dot, ext = name.rpartition(".")
    if dot and stem:
        return stem, "." + ext
    return name, ""


def part_path(path: str | os.PathLike, part: int) -> Path:
    """Path of rotated part ``part`` (0 is ``path`` itself): ``cap.jsonl`` →
    ``cap.1.jsonl``, ``cap.jsonl.gz`` → ``cap.1.jsonl.gz``."""
    p = Path(path)
    if part == 0:
        return p
    stem, suf = _split_suffix(p)
    return p.with_name(f"{stem}.{part}{suf}")


def make_parent(path: str | os.PathLike) -> None:
    """Create the directories ``path`` goes in, as needed.

    Raises:
        OSError: they cannot be created; ``NotADirectoryError`` naming the parent
            when it is a file (not ``mkdir``'s "File exists").
    """
    parent = Path(path).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # (a file, or a link to one, where the directory should be)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                 str(parent)) from None


def part_continues(head: dict[str, Any], start: int | None) -> bool:
    """Whether a rotated part whose first record is ``head`` belongs to the capture
    whose first session line has ``start_ns`` ``start`` (``None``: it had none): the
    part opens with a session line of the same start (a part left from an older
    capture of the same name does not)."""
    return head.get("type") == "session" and (start is None or head.get("start_ns") == start)


def capture_parts(path: str | os.PathLike) -> list[Path]:
    """``path`` followed by its existing rotated parts, in order (stops at the first
    missing number). Whether a part belongs to the same capture is for the reader to
    check (:func:`part_continues`)."""
    out = [Path(path)]
    n = 1
    while True:
        p = part_path(path, n)
        if not p.exists():
            return out
        out.append(p)
        n += 1


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

def _b64(b: bytes) -> bytes:
    """Base64 as ASCII bytes, spliced into the JSON line as they are (see
    :meth:`CaptureWriter._append_line`): base64 needs no JSON escaping, and
    serialising a large frame's string through ``json.dumps`` costs several times
    the encoding."""
    return _b64encode(b)


_FRAME_KEY = b',"frame":"'
_SENT_KEY = b',"frame_sent":"'
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
    _IOV_MAX = 16
#: a frame line's first members, as ``json.dumps(..., separators=(",", ":"))`` writes
#: them (the test suite checks that they agree)
_FRAME_HEAD = ('{"type":"frame","ts_ns":%d,"conn":%d,"dir":%s,"client":%s,"upstream":%s,'
               '"flow":%d,"api_key":%d,"api_version":%d,"correlation_id":%d')
_JSON_TEXT: dict[str | None, str] = {}


def _json_text(v: str | None) -> str:
    """``json.dumps(v)`` of a string (or ``None``) a capture repeats on every line:
    addresses and directions (remembered, up to 4,096 of them)."""
    t = _JSON_TEXT.get(v)
    if t is None:
        if len(_JSON_TEXT) >= 4096:
            _JSON_TEXT.clear()
        t = _JSON_TEXT[v] = json.dumps(v)
    return t


def _frame_head(flow: Flow, direction: str, ts_ns: int) -> bytes:
    """A frame line up to ``correlation_id`` (no closing brace): formatted directly,
    which costs a fifth of ``json.dumps`` of a dict on a capture's busiest path."""
    ints = (ts_ns, flow.conn, flow.id, flow.api_key, flow.api_version, flow.correlation_id)
    texts = (direction, flow.client, flow.upstream)
    for v in ints:
        if type(v) is not int:
            return _frame_head_json(flow, direction, ts_ns)
    for v in texts:
        if v is not None and type(v) is not str:
            return _frame_head_json(flow, direction, ts_ns)
    return (_FRAME_HEAD % (ts_ns, flow.conn, _json_text(direction), _json_text(flow.client),
                           _json_text(flow.upstream), flow.id, flow.api_key, flow.api_version,
                           flow.correlation_id)).encode("ascii")


def _frame_head_json(flow: Flow, direction: str, ts_ns: Any) -> bytes:
    """:func:`_frame_head` for values a proxy never records (bools, floats, tuples...):
    json.dumps says how they are written."""
    return json.dumps({
        "type": "frame", "ts_ns": ts_ns, "conn": flow.conn, "dir": direction,
        "client": flow.client, "upstream": flow.upstream, "flow": flow.id,
        "api_key": flow.api_key, "api_version": flow.api_version,
        "correlation_id": flow.correlation_id,
    }, separators=(",", ":")).encode("utf-8")[:-1]


def _writev_all(fd: int, parts: list[bytes]) -> None:
    """Write every piece to ``fd`` in order (``os.writev``, at most IOV_MAX pieces per
    call, resuming after short writes)."""
    if not hasattr(os, "writev"):  # pragma: no cover - not POSIX
        data = memoryview(b"".join(parts))
        while data:
            data = data[os.write(fd, data):]
        return
    i = 0
    n_parts = len(parts)
    while i < n_parts:
        i = _advance(parts, i, os.writev(fd, parts[i:i + _IOV_MAX]))


def _advance(parts: list, i: int, n: int) -> int:
    """After ``n`` bytes of ``parts[i:]`` were written: the index of the first piece
    not written whole; a piece written in part is replaced by the rest of it."""
    while i < len(parts):
        size = len(parts[i])
        if n < size:  # (empty pieces are passed over even when n is 0)
            if n:
                parts[i] = memoryview(parts[i])[n:]
            break
        n -= size
        i += 1
    return i


class CaptureHooks:
    """The pipeline hooks of a capture writer, in terms of its ``write_frame(flow,
    direction, frame, sent, ts_ns)`` and ``_conn_line(conn, event, ts_ns)``: what a
    capture records of each event (shared by :class:`CaptureWriter` and
    :class:`~kinspect.capture_process.CaptureProcess`)."""

    def on_connect(self, conn: Any) -> None:
        self._conn_line(conn, "open", getattr(conn, "opened", None) or time.time_ns())

    def on_disconnect(self, conn: Any) -> None:
        self._conn_line(conn, "close", getattr(conn, "closed_ns", None) or time.time_ns())

    def on_request(self, flow: Flow) -> None:
        if UNPAIRED in flow.flags:
            return
        self.write_frame(flow, "req", flow.request, flow.request_sent, flow.request_ns)

    def on_flow(self, flow: Flow) -> None:
        if flow.response is None:
            return
        self.write_frame(flow, "resp", flow.response, flow.response_sent,
                         flow.response_ns or time.time_ns())


class CaptureWriter(CaptureHooks):
    """Pipeline addon writing a capture file (see the module docstring for the format).

    Args:
        path: file to write (``.gz`` suffix: gzip). Parent directories are created;
            an existing file is replaced.
        codec: used for redaction (decode/re-encode of SaslAuthenticate etc.).
        upstream, listen: ``"host:port"`` texts for the session line.
        secrets: keep secrets (``--capture-secrets``); by default they are redacted.
        max_bytes: rotate when a part would exceed this many JSON bytes (before
            gzip); ``None`` = never.
        flush_lines: write buffered lines to the file after this many lines,
        flush_bytes: ... or this many bytes,
        flush_interval: ... and at most this many seconds after a line was buffered
            (a timer on the running event loop; without one, checked on each line).
        direct: write an uncompressed capture through ``O_DIRECT`` where the file
            system allows it (:class:`~kinspect.pagecache.DirectAppender`; then
            ``flush_lines`` and ``flush_bytes`` do not apply: whole blocks are written
            as they fill, the rest after ``flush_interval``). ``False``: through the
            page cache, with drop-behind.

    Hooks (called by :class:`~kinspect.proxy.pipeline.Pipeline`): ``on_connect``,
    ``on_request``, ``on_flow``, ``on_disconnect``, ``close``.

    Attributes:
        lines, frames: counts written so far; ``paths``: parts written.
        error: the write error that ended the capture, or ``None``.

    Raises:
        OSError: the file cannot be created (at construction; ``NotADirectoryError``
            naming the parent when a file stands where its directory should be) or
            written (once, from the call whose write failed, ``filename`` the part;
            the part is cut back to its last whole line and later calls write nothing).
    """

    def __init__(self, path: str | os.PathLike, codec: Codec | None = None, *,
                 upstream: str = "", listen: str = "", secrets: bool = False,
                 max_bytes: int | None = None, flush_lines: int = 1000,
                 flush_bytes: int = 1 << 20, flush_interval: float = 1.0,
                 start_ns: int | None = None, direct: bool = True):
        self.path = Path(path)
        self.codec = codec or Codec()
        self.upstream = upstream
        self.listen = listen
        self.secrets = secrets
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.flush_lines = max(1, flush_lines)
        self.flush_bytes = max(1, flush_bytes)
        self._pending_bytes = 0
        self._pending_lines = 0
        self.flush_interval = flush_interval
        self.start_ns = start_ns if start_ns is not None else time.time_ns()
        self.gzip = self.path.name.endswith(".gz")
        self.direct = direct
        self._direct: DirectAppender | None = None
        self.lines = 0
        self.frames = 0
        self.redacted = 0
        self.paths: list[Path] = []
        self._part = -1
        self._raw: Any = None
        self._fh: Any = None
        self._part_bytes = 0
        self._pending: list[bytes] = []
        self._pending_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        #: the write error that ended the capture (``None`` while it goes on)
        self.error: OSError | None = None
        #: file offset of the current part's last whole line in the file, and (gzip)
        #: the CRC-32 and length of the text up to it
        self._good = 0
        self._good_crc = self._good_size = 0
        self._open_part(0)

    # -- files -----------------------------------------------------------------
    def _session_line(self) -> dict[str, Any]:
        return {
            "type": "session", "kinspect": __version__, "start_ns": self.start_ns,
            "upstream": self.upstream, "listen": self.listen,
            "specs": [{"path": s.path, "origin": s.origin}
                      for s in getattr(self.codec.registry, "sources", [])],
            "part": self._part, "secrets": self.secrets,
            "redaction_marker": REDACTION_MARKER.decode("ascii"),
        }

    def _open_part(self, part: int) -> None:
        p = part_path(self.path, part)
        make_parent(p)
        raw = open(p, "wb", buffering=0)
        self._raw = raw
        self._drop = DropBehind(raw.fileno())
        self._direct = (DirectAppender.open(p, raw.fileno()) if self.direct and not self.gzip
                        else None)
        self._fh = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if self.gzip \
            else raw
        self._part = part
        self._part_bytes = 0
        self._part_lines = 0
        self._good = raw.tell()  # (after the gzip header)
        self._good_crc = self._good_size = 0
        self.paths.append(p)
        self._append(self._session_line(), rotate=False)

    def _close_part(self) -> None:
        try:
            if self.error is None:
                self._write_pending()
        finally:
            direct, self._direct = self._direct, None
            try:
                if direct is not None:
                    if self.error is not None:
                        direct.flushed = True  # (the file was cut: write nothing more)
                    direct.close()
                if self._fh is not self._raw:
                    if self.error is not None:
                        self._fh.fileobj = None  # (the file was cut and ended already)
                    self._fh.close()
                self._drop.close()
            finally:
                self._raw.close()

    # -- buffering -------------------------------------------------------------
    def _append(self, obj: dict[str, Any], rotate: bool = True) -> None:
        """Buffer one line: ``obj`` as compact JSON."""
        head = json.dumps(obj, separators=(",", ":")).encode("utf-8")
        self._add([head, b"\n"], len(head) + 1, rotate)

    def _append_line(self, head: bytes, raws: tuple[tuple[bytes, bytes], ...],
                     rotate: bool = True) -> None:
        """Buffer one line: ``head`` (a JSON object's text without its closing brace),
        the ``raws`` (``(key, base64)`` pairs, keys pre-encoded as ``b',"name":"'``) as
        string members, and the brace. The line stays a list of pieces up to the write
        (``os.writev``), so a large frame's base64 is never copied again."""
        parts = [head]
        size = len(head) + 2
        for key, b64 in raws:
            parts += (key, b64, b'"')
            size += len(key) + len(b64) + 1
        parts.append(b"}\n")
        self._add(parts, size, rotate)

    def _add(self, parts: list[bytes], size: int, rotate: bool) -> None:
        if (rotate and self.max_bytes is not None and self._part_lines > 0
                and self._part_bytes + size > self.max_bytes):
            self._close_part()
            self._open_part(self._part + 1)
        self._part_bytes += size
        self._part_lines += rotate
        self.lines += 1
        direct = self._direct
        if direct is not None:  # straight into its buffer; whole blocks go out as they fill
            if direct.flushed:
                self._pending_since = time.monotonic()
                self._arm_timer()
            try:
                direct.write_parts(parts)
            except OSError as e:
                self._cut(e)
            if direct.refused:  # all of it went through the page cache: go on that way
                self._direct = None
                direct.close()
            elif time.monotonic() - self._pending_since >= self.flush_interval:
                self.flush()
            return
        if not self._pending:
            self._pending_since = time.monotonic()
            self._pending_bytes = 0
            self._pending_lines = 0
            self._arm_timer()
        self._pending += parts
        self._pending_bytes += size
        self._pending_lines += 1
        if (self._pending_lines >= self.flush_lines or self._pending_bytes >= self.flush_bytes
                or time.monotonic() - self._pending_since >= self.flush_interval):
            self.flush()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self.flush_interval, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._closed:
            self.flush()

    def _cut(self, e: OSError) -> None:
        """A write failed (a full disk, ``EIO``): cut the part back to its last whole
        line (a gzip part is ended there, with its trailer), write nothing more, and
        raise ``e`` naming the file."""
        self.error = e
        self._pending = []
        fd = self._raw.fileno()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe, a device: nothing to cut
                raise OSError(errno.ESPIPE, "not a regular file")
            if not self.gzip:  # lines written whole before the failed one stay
                with open(self.paths[-1], "rb") as r:
                    r.seek(self._good)
                    self._good += r.read(max(0, os.fstat(fd).st_size - self._good)
                                         ).rfind(b"\n") + 1
            os.ftruncate(fd, self._good)
            if self.gzip:  # end the stream at the last sync point: an empty final block
                os.pwrite(fd, b"\x03\x00" + struct.pack("<II", self._good_crc,
                                                         self._good_size & 0xFFFFFFFF),
                          self._good)
        except OSError:  # not a regular file, or not even room for the trailer
            pass
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(self.paths[-1])) from e
        raise e

    def _write_pending(self) -> None:
        if self.error is not None:
            return
        try:
            self._write_pending_lines()
        except OSError as e:
            self._cut(e)

    def _write_pending_lines(self) -> None:
        direct = self._direct
        if direct is not None:
            direct.flush()
            self._good = direct.end
            if direct.refused:
                self._direct = None
                direct.close()
            return
        if not self._pending:
            return
        parts = self._pending
        self._pending = []
        fh = self._fh
        fd = self._raw.fileno()
        if fh is self._raw:
            _writev_all(fd, parts)
        else:
            fh.write(b"".join(parts))
            fh.flush(zlib.Z_SYNC_FLUSH)
            self._good_crc, self._good_size = fh.crc, fh.size
        try:
            end = self._good = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:  # not seekable (a pipe): nothing to drop, nothing to cut
            self._drop.active = False
            return
        if self._drop.active:
            self._drop.wrote(end)

    def flush(self) -> None:
        """Write every buffered line to the file now (whole lines only)."""
        if self._closed:
            return
        self._write_pending()

    def flush_due(self) -> float | None:
        """Seconds until the lines buffered so far are due in the file (0 when they
        are), ``None`` when none are buffered: how long a caller without an event
        loop may wait before calling :meth:`flush`."""
        waiting = (self._direct is not None and not self._direct.flushed) or self._pending
        if self._closed or not waiting:
            return None
        return max(0.0, self._pending_since + self.flush_interval - time.monotonic())

    def close(self) -> None:
        """Flush and close the file (idempotent; after a write error too, which it
        raises)."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self._close_part()
        finally:
            self._closed = True

    def __enter__(self) -> "CaptureWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- records ---------------------------------------------------------------
    def write_frame(self, flow: Flow, direction: str, frame: bytes | memoryview,
                    sent: bytes | memoryview | None, ts_ns: int) -> None:
        """Write one frame line for ``flow`` (``direction`` ``"req"``/``"resp"``),
        redacting secrets unless :attr:`secrets` is set. ``frame`` and ``sent`` may be
        any bytes-like objects; nothing keeps them after the call."""
        if self._closed or self.error is not None:
            return
        redacted = False
        if not self.secrets:
            token = SASL_TOKEN in flow.flags
            r = redact_frame(self.codec, frame, direction, flow.api_key, flow.api_version,
                             sasl_token=token)
            if r is not None:
                frame, redacted = r, True
            if sent is not None:
                r = redact_frame(self.codec, sent, direction, flow.api_key, flow.api_version,
                                 sasl_token=token)
                if r is not None:
                    sent, redacted = r, True
        head = _frame_head(flow, direction, ts_ns)
        if flow.flags:
            head += b',"flags":' + json.dumps(sorted(flow.flags), separators=(",", ":")).encode()
        if flow.notes:
            head += b',"notes":' + json.dumps(flow.notes, separators=(",", ":")).encode()
        if redacted:
            head += b',"redacted":true'
            self.redacted += 1
        self.frames += 1
        if sent is not None and sent != frame:
            self._append_line(head, ((_FRAME_KEY, _b64(frame)), (_SENT_KEY, _b64(sent))))
        else:
            self._append_line(head, ((_FRAME_KEY, _b64(frame)),))

    def _conn_line(self, conn: Any, event: str, ts: int) -> None:
        if self._closed or self.error is not None:
            return
        self._append({"type": "conn", "event": event, "ts_ns": ts, "conn": conn.id,
                      "client": conn.client, "upstream": conn.upstream_addr})


# ---------------------------------------------------------------------------
# CLI glue (used by ``kinspect proxy`` and ``kinspect demo``)
# ---------------------------------------------------------------------------

def _size(text: str) -> int:
    try:
        n = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return n


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--capture FILE``, ``--capture-max-bytes N`` and ``--capture-secrets``."""
    g = parser.add_argument_group("capture")
    g.add_argument("--capture", metavar="FILE",
                   help="record every frame to FILE (JSON Lines; gzip if it ends in .gz); "
                        "a bare file name goes under captures/")
    g.add_argument("--capture-max-bytes", metavar="N", type=_size, default=None,
                   help="rotate the capture when a part would exceed N bytes of JSON "
                        "(suffixes K, M, G): FILE, FILE.1, FILE.2 ... named like cap.1.jsonl")
    g.add_argument("--capture-secrets", action="store_true",
                   help="keep SASL secrets in the capture (default: replaced by the marker "
                        "'<kinspect:redacted>' repeated to the same length)")


def _hostport(addr: Any) -> str:
    if isinstance(addr, str):
        return addr
    if addr is None:
        return ""
    from .proxy.server import format_hostport

    return format_hostport(addr[0], addr[1])


def capture_addon_from_args(args: argparse.Namespace, proxy_config: Any,
                            codec: Codec, listen: tuple[str, int] | None = None) -> Any:
    """The capture addon the command-line options ask for, or ``None`` without
    ``--capture``: a :class:`~kinspect.capture_process.CaptureProcess` (the writing
    runs in a child process, off the event loop). Add it with
    ``proxy.pipeline.add(writer)``; the pipeline closes it. ``listen``: the address
    the proxy is bound to, for the session line (default: ``proxy_config.listen``,
    whose port may be 0; see :meth:`~kinspect.proxy.server.Proxy.listen_address`).

    Raises:
        CaptureError: the capture file cannot be created.
    """
    from .capture_process import CaptureProcess

    name = getattr(args, "capture", None)
    if not name:
        return None
    path = resolve_capture_path(name)
    writer = CaptureProcess(
        path, codec,
        upstream=_hostport(getattr(proxy_config, "upstream", None)),
        listen=_hostport(listen or getattr(proxy_config, "listen", None)),
        secrets=bool(getattr(args, "capture_secrets", False)),
        max_bytes=getattr(args, "capture_max_bytes", None),
    )
    log.info("capturing to %s%s", path, "" if writer.secrets else " (secrets redacted)")
    return writer


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

#: the longest line :func:`read_capture` reads from a compressed part by default,
#: bytes once decompressed: a frame of ``DEFAULT_MAX_FRAME`` bytes and its sent
#: version, both in base64, and 1 MiB for the rest of the line
MAX_LINE_BYTES = 2 * (4 * ((DEFAULT_MAX_FRAME + 2) // 3)) + (1 << 20)


def _open_read(path: Path):
    """``path`` opened for reading, through gzip when its first bytes say so. The
    file is opened once and its first bytes peeked at, not read, so a pipe or FIFO
    (``kinspect show <(zcat a.jsonl.gz)``) reads whole too."""
    fh = open(path, "rb")
    try:
        magic = fh.peek(2)[:2]
    except BaseException:
        fh.close()
        raise
    if magic == b"\x1f\x8b":
        return _GzipReader(fh)
    return fh


class _GzipReader(gzip.GzipFile):
    """A gzip stream over a file it closes with itself."""

    def __init__(self, raw: Any) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _lines(fh: Any, path: Path, limit: int | None) -> Iterator[bytes | CaptureError]:
    """The lines of ``fh``; with ``limit``, a line longer than that many bytes ends
    them with a :class:`CaptureError` (yielded, not raised, so that the line before
    it is still used), read no further than ``limit + 1`` of its bytes."""
    if limit is None:
        yield from fh
        return
    lineno = 0
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > limit:
            yield CaptureError(
                f"a line longer than {limit} bytes once decompressed: not a line of a "
                f"capture of frames up to {DEFAULT_MAX_FRAME >> 20} MiB (max_line_bytes)",
                path, lineno)
            return
        yield raw


def _read_one(path: Path, max_line_bytes: int | None = None
              ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, record)``; a torn last line is skipped with a warning,
    blank lines (whitespace only) silently, wherever they are, and so is what a
    gzip stream cut short loses. ``max_line_bytes``: see :func:`read_capture`
    (applied to compressed files only).

    Raises:
        CaptureError: see :func:`read_capture`; compressed data that is corrupt
            (bad deflate data, a CRC or length that does not match) names the file.
    """
    try:
        fh = _open_read(path)
    except FileNotFoundError:
        raise CaptureError("no such file", path) from None
    except OSError as e:
        raise CaptureError(f"cannot open: {e}", path) from None
    limit = max_line_bytes if isinstance(fh, gzip.GzipFile) else None
    with fh:
        lineno = 0
        prev: bytes | None = None
        raw: Any = None
        try:
            for raw in _lines(fh, path, limit):
                if prev is not None:
                    lineno += 1
                    if not prev.isspace():
                        yield lineno, _parse(prev, path, lineno, last=False)
                if isinstance(raw, CaptureError):
                    raise raw
                prev = raw
        except (zlib.error, gzip.BadGzipFile) as e:
            # not cut short but damaged: what was read may be wrong too
            raise CaptureError(f"compressed data is corrupt after line "
                               f"{lineno + (prev is not None)} ({e})", path) from None
        except CaptureError as e:
            if e is raw:  # a line too long: stopped early on purpose (a gzip bomb)
                raise
            raise _corrupt_instead(fh, path, e) from None
        except EOFError as e:
            # a gzip stream cut short by a crash: everything before was readable
            warnings.warn(f"{path}: compressed data ends early ({e}); "
                          f"the lines after {lineno + (prev is not None)} are lost",
                          CaptureWarning, stacklevel=3)
            if prev is not None and prev.endswith(b"\n"):
                lineno += 1
                if not prev.isspace():
                    yield lineno, _parse(prev, path, lineno, last=False)
            elif prev is not None:
                warnings.warn(f"{path}:{lineno + 1}: torn last line skipped "
                              f"({len(prev)} bytes)", CaptureWarning, stacklevel=3)
            return
        if prev is None or prev.isspace():
            return
        lineno += 1
        try:  # a last line without newline is kept when it is a whole JSON object
            rec = _parse(prev, path, lineno, last=True)
        except CaptureError as e:
            if lineno == 1:  # nothing else in the file: not a torn capture
                raise CaptureError("not a kinspect capture: its only line is not a JSON "
                                   "object", path, lineno) from None
            warnings.warn(f"{e}; torn last line skipped ({len(prev)} bytes)", CaptureWarning,
                          stacklevel=3)
            return
        _check(rec, path, lineno)
        yield lineno, rec


#: inflated bytes read past a gzip capture's line that does not read, to find out
#: whether the compressed data is corrupt (some 0.2 s of inflating)
CORRUPT_CHECK_BYTES = 64 << 20


def _corrupt_instead(fh: Any, path: Path, e: CaptureError) -> CaptureError:
    """What to say of a line that does not read (``e``): when ``fh`` is a gzip
    stream whose data turns out to be corrupt further on (its CRC is checked only at
    the end: damaged deflate data may inflate to garbage first), that corruption,
    with the line as what it spoiled; else ``e``. Reads on in the stream, up to
    :data:`CORRUPT_CHECK_BYTES` inflated bytes (past those, ``e`` stands)."""
    if not isinstance(fh, gzip.GzipFile):
        return e
    left = CORRUPT_CHECK_BYTES
    try:
        while left > 0:
            got = len(fh.read(min(left, 1 << 20)))
            if not got:
                break
            left -= got
    except (zlib.error, gzip.BadGzipFile) as z:
        return CaptureError(f"compressed data is corrupt ({z}); line {e.line}, inflated "
                            f"from it, does not read: {e.reason}", path)
    except (EOFError, OSError):  # cut short, or unreadable: the line's own error stands
        pass
    return e


def _parse(raw: bytes, path: Path, lineno: int, last: bool) -> dict[str, Any]:
    try:
        rec = _orjson_loads(raw)  # a quarter of json's time a line
    except ValueError:
        rec = None
    if type(rec) is not dict or not _as_json_reads(rec):
        # what orjson refuses (NaN, a lone surrogate, UTF-16, nesting past 1023...),
        # reads as no object, or may read otherwise goes to json, whose result or
        # error stands: a line reads as json reads it
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise CaptureError(f"not a JSON line ({e})", path, lineno) from None
        except RecursionError:  # e.g. [[[[...: valid JSON, but no capture line
            raise CaptureError("not a JSON line (values nested too deeply)", path,
                               lineno) from None
    if not isinstance(rec, dict):
        raise CaptureError("a line is not a JSON object", path, lineno)
    if not last:
        _check(rec, path, lineno)
    return rec


#: the types of values orjson reads as json does
_PLAIN = frozenset((str, int, bool, type(None)))


def _as_json_reads(rec: dict[str, Any]) -> bool:
    """Whether orjson's reading of a line is surely json's: its values are strings,
    integers, booleans, nulls and lists of strings, as in kinspect's frame and conn
    lines. orjson makes an integer past 64 bits a float (json keeps it whole), and
    follows nesting to 1023 levels, where json stops at the recursion limit
    (RecursionError: some 990 levels by default): a line with a float or a nested
    value (a session line's ``specs``) is read by json."""
    kinds = set(map(type, rec.values()))
    if kinds <= _PLAIN:
        return True
    if list not in kinds or not kinds - {list} <= _PLAIN:
        return False
    return all(type(x) is str for v in rec.values() if type(v) is list for x in v)


#: keys of frame and conn lines that must hold integers when present (``ts_ns`` may
#: also be null: not known), and the bits they have (as ``kinspect analyze`` reads
#: them into Spark; api key, api version and correlation id are at most 32 on the wire)
_INT_KEYS = ("conn", "ts_ns", "flow", "api_key", "api_version", "correlation_id")
_INT_BITS = {"conn": 64, "ts_ns": 64, "flow": 64, "api_key": 32, "api_version": 32,
             "correlation_id": 32}


_STR_KEYS = ("dir", "client", "upstream", "event")


_INT_RANGES = tuple((key, -(1 << (_INT_BITS[key] - 1)), 1 << (_INT_BITS[key] - 1))
                    for key in _INT_KEYS)


def _bad_value(rec: dict[str, Any]) -> str | None:
    """Why a frame or conn record cannot be used (a key that must hold an integer, a
    string or a list of strings holds something else), or ``None``."""
    if rec.get("type", "frame") not in ("frame", "conn"):
        return None
    get = rec.get
    for key, low, high in _INT_RANGES:
        v = get(key)
        if type(v) is int:
            if low <= v < high:
                continue
            return f"{key!r} must be a {_INT_BITS[key]}-bit integer, got {v}"
        if v is None and (key != "conn" or "conn" not in rec):
            continue  # absent (or a null ts_ns, flow id...: not known)
        return f"{key!r} must be an integer, got {json.dumps(v)}"
    for key in _STR_KEYS:
        v = rec.get(key)
        if v is not None and type(v) is not str:
            return f"{key!r} must be a string, got {json.dumps(v)}"
    for key in ("flags", "notes"):
        v = rec.get(key)
        if v is not None and (type(v) is not list or any(type(f) is not str for f in v)):
            return f"{key!r} must be a list of strings, got {json.dumps(v)}"
    return None


def _check(rec: dict[str, Any], path: Path, lineno: int) -> None:
    why = _bad_value(rec)
    if why is not None:
        raise CaptureError(why, path, lineno)


def read_capture(path: str | os.PathLike, *, parts: bool = True,
                 max_line_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield every record (dict) of a capture file, in file order.

    Args:
        path: a ``.jsonl`` or ``.jsonl.gz`` capture (gzip is detected by content).
        parts: also read the rotated parts ``FILE.1``, ``FILE.2`` ... that belong to
            the same capture (same session ``start_ns``).
        max_line_bytes: the longest line read from a compressed part, in bytes once
            decompressed (default :data:`MAX_LINE_BYTES`: a frame and its sent
            version of ``DEFAULT_MAX_FRAME`` each, in base64, and 1 MiB more), so
            that a small compressed file cannot make the reader hold gigabytes
            for one line. An uncompressed part's lines are only as long as the
            bytes read.

    Warns:
        CaptureWarning: a torn last line (crash while writing) was skipped.

    Blank lines are skipped.

    Raises:
        CaptureError: missing file, a line other than the last that is not a JSON
            object (or a file whose only line is not one: no capture), a
            frame/conn line with an id that is not an integer, a line of a
            compressed part longer than ``max_line_bytes``, or compressed data
            that is corrupt (not cut short: that is a warning).
    """
    return _records(path, parts, max_line_bytes, None)


def _records(path: str | os.PathLike, parts: bool, max_line_bytes: int | None,
             where: list | None) -> Iterator[dict[str, Any]]:
    """:func:`read_capture`'s records; with ``where`` (a list of two), ``where[0]``
    and ``where[1]`` are the path and line number of the record last yielded."""
    files = capture_parts(path) if parts else [Path(path)]
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    start = None
    for i, p in enumerate(files):
        first = True
        if where is not None:
            where[0] = p
        for lineno, rec in _read_one(p, limit):
            if first:
                if i == 0:
                    start = rec.get("start_ns") if rec.get("type") == "session" else None
                elif not part_continues(rec, start):
                    return  # a stale part of another capture
            first = False
            if where is not None:
                where[1] = lineno
            yield rec


@dataclass
class FrameRef:
    """One frame of a rebuilt capture, in file order: ``flow``, ``dir`` ("req"/"resp"),
    ``ts_ns``."""

    flow: Flow
    dir: str
    ts_ns: int


@dataclass
class Capture:
    """A capture read back: the session line, rebuilt flows (by flow id order of
    first appearance), frames in file order and connection events.

    Attributes:
        session: the first session record (``{}`` when the file has none).
        flows: :class:`~kinspect.flows.Flow` objects, decoded when asked.
        frames: :class:`FrameRef` list in file order.
        conns: ``conn id -> {"client", "upstream", "open_ns", "close_ns"}``.
    """

    session: dict[str, Any] = field(default_factory=dict)
    flows: list[Flow] = field(default_factory=list)
    frames: list[FrameRef] = field(default_factory=list)
    conns: dict[int, dict[str, Any]] = field(default_factory=dict)

    def flow(self, flow_id: int) -> Flow | None:
        for f in self.flows:
            if f.id == flow_id:
                return f
        return None


def _decode_b64(rec: dict[str, Any], key: str, where: str = "") -> bytes | None:
    """The bytes of ``rec[key]`` (base64 text), ``None`` when absent or null.

    Raises:
        CaptureError: anything else (``"KEY of WHERE is not base64"``, or
            ``"KEY is not base64"`` without ``where``).
    """
    v = rec.get(key)
    if v is None:
        return None
    try:
        return _b64decode(v, validate=True)
    except (ValueError, TypeError):
        raise CaptureError(f"{key} of {where} is not base64" if where
                           else f"{key} is not base64") from None


_SASL_HANDSHAKE = 17
_HHI = struct.Struct(">hhi").unpack_from


class _Checked:
    """Records from this module's reader, every one checked (``_check``) as read:
    :func:`flows_from_records` does not check them again."""

    __slots__ = ("records",)

    def __init__(self, records: Iterable[dict[str, Any]]):
        self.records = records

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)


def flows_from_records(records: Iterable[dict[str, Any]], codec: Codec | None = None, *,
                       decode: bool = True) -> Capture:
    """Rebuild flows from capture records (as yielded by :func:`read_capture`).

    Frames are paired by their ``flow`` id when present; otherwise (captures of
    other tools: only ``conn``, ``dir``, ``frame`` required) a response pairs with
    the request of the same connection and correlation id, and raw SASL tokens
    (after a successful SaslHandshake v0) pair in order, like the proxy does.
    Missing ``api_key``/``api_version``/``correlation_id`` are read from the frame
    header. Flows get ``redacted`` as a flag when a line was redacted (and
    ``redacted-request`` when it was the request's: its secrets are markers); a request
    without response on a connection that closed gets ``closed``; a response whose
    request is not in the records (a later rotated part read alone, a capture
    started mid-connection) gets ``unpaired``, keeps the api its line names, and has
    an empty ``request``. Captures appended to each other (``cat a.jsonl b.jsonl``: a
    session line that is not a rotated part of the capture before it) keep all their
    flows: each one's flow and connection ids are moved past the ids used before it.

    Args:
        codec: decodes the flows (default spec search path when ``None``).
        decode: decode request/response bodies (``decode_flow``).

    Raises:
        CaptureError: a frame line without ``conn``/``dir``/``frame``, whose ``frame``
            is not base64 text (null included; ``frame_sent`` may be null), or with
            an id that is not an integer (see the module docstring). It names the
            record by its number (``record``); :func:`load_capture` names the file
            and line instead.
    """
    from .proxy.pipeline import decode_recorded

    codec = codec or Codec()
    cap = Capture()
    by_id: dict[int, Flow] = {}
    pending: dict[tuple[int, int], Flow] = {}   # (conn, corr) -> flow awaiting a response
    # conn -> flows awaiting responses, in order (by id(flow): an answered one leaves in
    # O(1) whatever its place, so answers in any order pair in linear time)
    inflight: dict[int, dict[int, Flow]] = {}
    sasl_raw: dict[int, bool] = {}
    next_id = 0
    order: list[Flow] = []

    def new_flow(fid: int | None, rec: dict, api_key: int, api_version: int, corr: int,
                 name: str, request: bytes, ts: int) -> Flow:
        nonlocal next_id
        if fid is None:
            next_id += 1
            fid = next_id
            while fid in by_id:
                next_id += 1
                fid = next_id
        else:
            next_id = max(next_id, fid)
        conn = rec.get("conn", 0) + conn_base
        info = cap.conns.get(conn, {})
        f = Flow(fid, conn, rec.get("client") or info.get("client") or "",
                 rec.get("upstream") or info.get("upstream") or "",
                 api_key, api_version, corr, name, request, ts)
        by_id[fid] = f
        order.append(f)
        return f

    # captures appended to each other (cat a.jsonl b.jsonl) number their flows and
    # connections from 1 again: each one after the first is moved past the ids
    # used before it (a rotated part, same start_ns and part > 0, goes on as it is)
    flow_base = conn_base = max_conn = 0
    start: Any = None
    checked = type(records) is _Checked
    for n, rec in enumerate(records, 1):
        typ = rec.get("type", "frame")
        why = None if checked else _bad_value(rec)
        if why is not None:
            raise CaptureError(why, record=n)
        if typ == "session":
            if not cap.session:
                cap.session = rec
            elif not rec.get("part") or rec.get("start_ns") != start:
                flow_base, conn_base = next_id, max_conn
            start = rec.get("start_ns")
            continue
        if typ in ("conn", "frame") and type(rec.get("conn")) is int:
            max_conn = max(max_conn, rec["conn"] + conn_base)
        if typ == "conn":
            c = cap.conns.setdefault(rec.get("conn", 0) + conn_base, {})
            c.setdefault("client", rec.get("client"))
            c.setdefault("upstream", rec.get("upstream"))
            c["open_ns" if rec.get("event") == "open" else "close_ns"] = rec.get("ts_ns")
            continue
        if typ != "frame":
            continue
        if "conn" not in rec or "dir" not in rec or "frame" not in rec:
            raise CaptureError("a frame line lacks conn, dir or frame", record=n)
        try:
            frame = _decode_b64(rec, "frame")
            sent = _decode_b64(rec, "frame_sent")
        except CaptureError as e:
            raise CaptureError(e.reason, record=n) from None
        if frame is None:  # (null: no frame at all, not an empty one)
            raise CaptureError("frame is not base64", record=n)
        conn = rec["conn"] + conn_base
        direction = rec["dir"]
        ts = rec.get("ts_ns")
        flags = set(rec.get("flags") or ())
        if ts is None:  # (absent or null: not known; 0 keeps the frames in file order)
            ts = 0
            flags.add(UNTIMED)
        if rec.get("redacted"):
            flags.add(REDACTED)
            if direction == "req":
                flags.add(REDACTED_REQUEST)
        fid = rec.get("flow")
        if fid is not None:
            fid += flow_base
        c = cap.conns.setdefault(conn, {})
        c.setdefault("client", rec.get("client"))
        c.setdefault("upstream", rec.get("upstream"))
        if direction == "req":
            api_key = rec.get("api_key")
            api_version = rec.get("api_version")
            corr = rec.get("correlation_id")
            token = SASL_TOKEN in flags
            if api_key is not None and api_key >= 0 and not token and len(frame) >= 8 and (
                    api_version is None or corr is None):
                _, v, cid = _HHI(frame, 0)  # the line names the api only: the header the rest
                api_version = v if api_version is None else api_version
                corr = cid if corr is None else corr
            if api_key is None:  # a capture of another tool: read the header
                if len(frame) >= 8:
                    k, v, cid = _HHI(frame, 0)
                    if sasl_raw.get(conn) and codec.request_header_version(k, v) is None:
                        token = True
                    else:
                        sasl_raw[conn] = False
                        api_key, api_version, corr = k, v, cid
                else:
                    token = bool(sasl_raw.get(conn))
                if token:
                    flags.add(SASL_TOKEN)
                if api_key is None:
                    api_key, api_version, corr = -1, -1, -1
                    if not token:
                        flags.add(NO_RESPONSE)
            if token:
                name = "SaslToken"
            elif api_key == -1:  # (no header; another negative key is one: ApiKey(-5))
                name = "Malformed"
            else:
                name = codec.api_name(api_key)
            flow = by_id.get(fid) if fid is not None else None
            if flow is None:
                flow = new_flow(fid, rec, api_key, api_version if api_version is not None else -1,
                                corr if corr is not None else -1, name, frame, ts)
            else:
                flow.request, flow.request_ns = frame, ts
            flow.request_sent = sent
            flow.flags |= flags
            _add_notes(flow, rec.get("notes"))
            if NO_RESPONSE not in flags and name != "Malformed":
                if SASL_TOKEN in flow.flags:
                    inflight.setdefault(conn, {})[id(flow)] = flow
                else:
                    pending[(conn, flow.correlation_id)] = flow
                    inflight.setdefault(conn, {})[id(flow)] = flow
            cap.frames.append(FrameRef(flow, "req", ts))
        elif direction == "resp":
            flow = by_id.get(fid) if fid is not None else None
            q = inflight.get(conn, {})
            if flow is None and fid is None:
                first = next(iter(q.values()), None)
                if first is not None and SASL_TOKEN in first.flags:
                    flow = first
                elif len(frame) >= 4:
                    corr = int.from_bytes(frame[:4], "big", signed=True)
                    flow = pending.get((conn, corr))
            if flow is None:
                corr = rec.get("correlation_id")
                if corr is None:
                    corr = int.from_bytes(frame[:4], "big", signed=True) if len(frame) >= 4 else -1
                # null, like absent: not known (-1)
                api_key = rec.get("api_key")
                api_key = -1 if api_key is None else api_key
                api_version = rec.get("api_version")
                api_version = -1 if api_version is None else api_version
                flow = new_flow(fid, rec, api_key, api_version, corr,
                                "Unpaired" if api_key < 0 else codec.api_name(api_key), b"", ts)
                # its request is not in the file (e.g. a later rotated part): named
                # when the line says what it answers, flagged either way
                flags.add(UNPAIRED)
            else:
                pending.pop((conn, flow.correlation_id), None)
                q.pop(id(flow), None)
            flow.response, flow.response_ns = frame, ts
            flow.response_sent = sent
            flow.flags |= flags
            _add_notes(flow, rec.get("notes"))
            if (flow.api_key == _SASL_HANDSHAKE and flow.api_version == 0 and len(frame) >= 6
                    and frame[4:6] == b"\x00\x00"):
                sasl_raw[conn] = True
            cap.frames.append(FrameRef(flow, "resp", ts))
        else:
            raise CaptureError(f"'dir' is {direction!r} (expected req or resp)", record=n)

    for conn, q in inflight.items():
        if cap.conns.get(conn, {}).get("close_ns") is not None:
            for f in q.values():
                if f.response is None:
                    f.flags.add(CLOSED)
    if decode:
        for f in order:
            if f.api_key >= 0:
                decode_recorded(codec, f)
    cap.flows = order
    return cap


def _add_notes(flow: Flow, notes: list[str] | None) -> None:
    """Add a frame line's notes the flow does not have yet (a response line
    repeats its request line's), in order."""
    if notes:
        flow.notes.extend(n for n in notes if n not in flow.notes)


def load_capture(path: str | os.PathLike, codec: Codec | None = None, *,
                 decode: bool = True) -> Capture:
    """:func:`read_capture` + :func:`flows_from_records` (rotated parts followed).

    Raises:
        CaptureError: see both functions; each names the file (the part) and line.
    """
    where: list = [path, None]  # (the reader keeps it at the record last read)
    try:
        return flows_from_records(_Checked(_records(path, True, None, where)), codec,
                                  decode=decode)
    except CaptureError as e:
        if e.record is None:
            raise  # (the reader's own: it names the file and line)
        raise CaptureError(e.reason, where[0], where[1]) from None
