"""Split a byte stream into Kafka frames (int32 size prefix, then that many bytes).

Source: Kafka protocol guide, "Common Request and Response Structure".
"""

from __future__ import annotations

from struct import Struct

from .errors import DecodeError

_SIZE = Struct(">i")
#: Kafka's socket.request.max.bytes default.
DEFAULT_MAX_FRAME = 100 * 1024 * 1024


class FrameSizeError(DecodeError):
    """A size prefix that is negative or larger than the configured maximum.

    Attributes:
        frames: whole frames that preceded the bad prefix in the same feed.
    """

    frames: list[bytes] = []


class FrameSplitter:
    """Incremental frame splitter: feed bytes as they arrive, get whole frames.

    Frames are returned without their 4-byte size prefix. A partial frame stays
    buffered until the rest arrives; the buffer never grows beyond one maximal
    frame plus one read.

    Args:
        max_frame: the largest accepted frame size in bytes.
    """

    __slots__ = ("max_frame", "_buf", "_need", "consumed")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need = -1  # size of the frame being assembled, -1 when unknown
        #: total bytes of whole frames returned so far (prefixes included)
        self.consumed = 0

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    @property
    def pending_size(self) -> int:
        """The size announced by the incomplete frame's prefix, or -1."""
        return self._need

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data``; return the frames it completes, in order.

        Raises:
            FrameSizeError: a size prefix that is negative or above ``max_frame``
                (the stream cannot be resynchronised after that).
        """
        buf = self._buf
        if not buf and len(data) >= 4:
            # fast path: whole frames straight from ``data`` without copying it first
            frames = []
            mv = memoryview(data)
            pos = 0
            end = len(mv)
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(mv, pos)
                self._check(size, pos, frames)
                if end - pos - 4 < size:
                    break
                frames.append(bytes(mv[pos + 4: pos + 4 + size]))
                pos += 4 + size
            self.consumed += pos
            if pos < end:
                buf += mv[pos:]
                self._need = -1
                if len(buf) >= 4:
                    self._need = _SIZE.unpack_from(buf, 0)[0]
            return frames
        buf += data
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            self._check(size, pos, frames)
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4: pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
            self.consumed += pos
        self._need = _SIZE.unpack_from(buf, 0)[0] if len(buf) >= 4 else -1
        return frames

    def _check(self, size: int, pos: int, frames: list[bytes]) -> None:
        if size < 0 or size > self.max_frame:
            err = FrameSizeError(
                f"frame size {size} outside 0..{self.max_frame}",
                offset=self.consumed + pos, expected="int32 frame size")
            err.frames = frames
            raise err


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its int32 size."""
    return _SIZE.pack(len(payload)) + payload
