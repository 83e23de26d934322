"""Exception family of the codec.

Every failure of the codec is a :class:`KinspectError`. Malformed input raises
:class:`DecodeError` (never ``IndexError``, ``struct.error`` or ``MemoryError``);
values that cannot be written raise :class:`EncodeError`; invalid spec files raise
:class:`SpecError`.
"""

from __future__ import annotations


class KinspectError(Exception):
    """Base class of every error raised by kinspect's codec."""


class SpecError(KinspectError):
    """An invalid message spec.

    Attributes:
        source: the file (or ``jar!member``) the spec came from.
        field: dotted path of the offending field inside the spec, or ``None``.
        reason: what is wrong.
    """

    def __init__(self, reason: str, source: str | None = None, field: str | None = None):
        self.reason = reason
        self.source = source
        self.field = field
        where = source or "<spec>"
        if field:
            where += f": field {field}"
        super().__init__(f"{where}: {reason}")


class DecodeError(KinspectError):
    """Malformed bytes.

    Attributes:
        reason: what went wrong, e.g. ``"truncated"`` or ``"array length 4294967295
            exceeds the 3 bytes left"``.
        offset: byte offset in the frame (after the 4-byte size prefix) where the
            failing item starts, or ``None`` if unknown.
        expected: what the decoder expected at ``offset`` (``"int32"``,
            ``"compact string"``...), or ``None``.
        path: field path such as ``"Topics[3].Partitions[0].ErrorCode"``, or ``None``.
        api: API name or key (``"Metadata"``), or ``None``.
        version: API version, or ``None``.
    """

    def __init__(
        self,
        reason: str,
        offset: int | None = None,
        expected: str | None = None,
        path: str | None = None,
        api: str | int | None = None,
        version: int | None = None,
    ):
        self.reason = reason
        self.offset = offset
        self.expected = expected
        self.path = path
        self.api = api
        self.version = version
        super().__init__(reason)

    def __str__(self) -> str:
        parts = []
        if self.api is not None:
            parts.append(f"{self.api}" + (f" v{self.version}" if self.version is not None else ""))
        if self.path:
            parts.append(self.path)
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        head = ", ".join(parts)
        msg = self.reason
        if self.expected:
            msg += f" (expected {self.expected})"
        return f"{head}: {msg}" if head else msg

    def to_dict(self) -> dict:
        """The error as a JSON-able dict (keys ``error``, ``offset``, ``expected``,
        ``path``, ``api``, ``version``)."""
        return {
            "error": self.reason,
            "offset": self.offset,
            "expected": self.expected,
            "path": self.path,
            "api": self.api,
            "version": self.version,
        }


class EncodeError(KinspectError):
    """A value that cannot be written: wrong type, out of range, or a non-default
    value in a version without the field (unless the field is ``ignorable``).

    Attributes:
        reason: what is wrong.
        path: field path, or ``None``.
    """

    def __init__(self, reason: str, path: str | None = None):
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)
