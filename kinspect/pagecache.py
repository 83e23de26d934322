"""Writing a capture without filling the page cache ("drop-behind").

A capture is written once, front to back, and read later if at all. Left to itself,
the kernel keeps every page of it cached, so a long capture grows the page cache by
its own size and every page written is one more page of memory allocated for it. On
a virtual machine whose host backs guest memory on first touch, that allocation
costs far more than the copy into the page: writing 256 MB to files that keep
growing cost 0.3-0.9 s of system time here, against 0.07-0.15 s with drop-behind
(BENCHMARKS.md, Proxy, fifth session).

:class:`DropBehind` follows the end of a file being written: every :data:`STEP`
bytes it asks the kernel to start writing them out
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``: it does not wait for the disk, though
it may block while the device's request queue is full, that is when the capture
outruns the disk), and it tells the kernel (``posix_fadvise(POSIX_FADV_DONTNEED)``)
that what lies more than :data:`LAG` bytes behind the last write-out request is no
longer needed. That advice drops only pages already on disk: a page still being
written when its turn comes stays cached until the file is closed, when the advice
is given again for the whole file. Where ``sync_file_range`` is missing (not Linux,
not in the C library, no ctypes) or refused (a pipe, a file system that does not
support it), only that last advice is given; where ``posix_fadvise`` is missing or
refused, nothing is, and the file is written as usual.
"""

from __future__ import annotations

import os
from typing import Any, Callable

#: bytes between two write-out requests
STEP = 8 << 20
#: bytes kept cached behind the last write-out request (so 32-40 MiB behind the end)
LAG = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>

_sync_file_range: Callable[[int, int, int, int], int] | None | bool = False  # not looked up


def _lookup_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """``sync_file_range(2)`` from the C library, or ``None`` where there is none."""
    global _sync_file_range
    if _sync_file_range is False:
        _sync_file_range = None
        if hasattr(os, "posix_fadvise"):
            try:
                import ctypes

                f = ctypes.CDLL(None, use_errno=True).sync_file_range
                f.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
                f.restype = ctypes.c_int
                _sync_file_range = f
            except Exception:  # noqa: BLE001 - no ctypes, no such symbol: go without
                _sync_file_range = None
    return _sync_file_range  # type: ignore[return-value]


class DropBehind:
    """Drop-behind for one file written sequentially through file descriptor ``fd``.

    Call :meth:`wrote` with the file's size (its end offset, bytes) after writes, and
    :meth:`close` before closing the descriptor. Neither raises: a refused call turns
    the part it belongs to off for this file.
    """

    def __init__(self, fd: int):
        self.fd = fd
        #: offset up to which writing out was requested
        self.started = 0
        #: offset up to which the cached pages were let go
        self.dropped = 0
        self._sync: Any = _lookup_sync_file_range()
        self._advise = hasattr(os, "posix_fadvise")

    @property
    def active(self) -> bool:
        """Whether :meth:`wrote` still does anything for this file."""
        return self._sync is not None and self._advise

    @active.setter
    def active(self, value: bool) -> None:
        if not value:
            self._sync = None

    def wrote(self, end: int) -> None:
        """The file now ends at ``end``: request write-out of each whole
        :data:`STEP` before it, and let go of what is more than :data:`LAG` behind
        the write-out requested (without ``sync_file_range``, nothing: pages not
        written out yet would only be skipped)."""
        if self._sync is None:
            return
        while end - self.started >= STEP:
            if self._sync(self.fd, self.started, STEP, _SYNC_FILE_RANGE_WRITE) != 0:
                self._sync = None  # e.g. ESPIPE: not a regular file
                return
            self.started += STEP
        limit = self.started - LAG
        if self._advise and limit - self.dropped >= STEP:
            self._drop(self.dropped, limit - self.dropped)
            self.dropped = limit

    def close(self) -> None:
        """Request write-out of the rest and let go of every page already written out
        (the pages still to be written stay cached until the kernel writes them)."""
        if self._sync is not None:
            self._sync(self.fd, self.started, 0, _SYNC_FILE_RANGE_WRITE)  # 0: to the end
        if self._advise:
            self._drop(0, 0)  # 0: to the end

    def _drop(self, offset: int, length: int) -> None:
        try:
            os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:  # e.g. ESPIPE: not a regular file; write-out alone is no help
            self._advise = False
            self._sync = None
