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

:class:`DirectAppender` does better where the file system allows it: it writes a
file through ``O_DIRECT`` (open(2)), from a buffer of its own aligned to
:data:`BLOCK`, so the bytes go from that buffer to the disk without a page of the
page cache being allocated, filled, written out and let go for them. On the
virtual machine the benchmarks run on, writing 420 MB in 1.4 MB lines cost
0.13-0.14 s of system time with drop-behind, against 0.02-0.03 s of system and
0.02 s of user time (the copy into the buffer) this way (BENCHMARKS.md, Proxy,
eighth session). Only whole blocks can be written so: the rest, less than a block,
goes through the page cache when :meth:`DirectAppender.flush` is called, and is
written again, with what follows it, in the next block.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
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


#: alignment of ``O_DIRECT`` writes (memory, file offset and length), bytes: a page,
#: a multiple of every logical block size in common use
BLOCK = 4096
#: bytes gathered before whole blocks are written out (:class:`DirectAppender`)
CHUNK = 4 << 20
#: errors with which a file system or device refuses ``O_DIRECT`` (at open or at the
#: first write): alignment or the flag not supported
_REFUSED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


class DirectAppender:
    """Appends to a new, empty regular file through ``O_DIRECT``.

    Bytes given to :meth:`write` are copied into a buffer of :data:`CHUNK` bytes
    (an anonymous mapping, so page-aligned); each time it fills, its whole blocks
    (:data:`BLOCK`) are written at once with ``O_DIRECT`` (a second descriptor on
    the file) and the rest, less than a block, moves to the buffer's start. So the
    file receives whole blocks as they fill, and may end inside a line between
    flushes. :meth:`flush` makes the file hold everything written so far: whole
    blocks by ``O_DIRECT``, the rest through ``fd``, the descriptor the caller opened
    (``pwrite`` at the offset where it belongs; it is written again in the next
    ``O_DIRECT`` block, with the same bytes). The caller does not write to ``fd``
    itself while this appender is in use.

    When the file system refuses ``O_DIRECT`` at the first write (``EINVAL``,
    ``EOPNOTSUPP``: alignment or the flag not supported), everything buffered is
    written through ``fd``, the file position of ``fd`` is left at the end, and
    :attr:`refused` is set: the caller writes on by itself from there. :meth:`open`
    returns ``None`` where it is refused at open (tmpfs on older kernels, for
    instance; newer ones take it there, which costs nothing: tmpfs pages are the
    file).

    Raises:
        OSError: any other write error (a full disk, ``EIO``), as ``write`` would.
    """

    __slots__ = ("fd", "direct_fd", "buf", "view", "base", "fill", "refused", "flushed")

    def __init__(self, fd: int, direct_fd: int):
        self.fd = fd
        self.direct_fd = direct_fd
        self.buf = mmap.mmap(-1, CHUNK)
        self.view = memoryview(self.buf)
        #: file offset of the buffer's first byte (a multiple of BLOCK)
        self.base = 0
        #: bytes in the buffer
        self.fill = 0
        #: the file system refused O_DIRECT: everything went through ``fd``
        self.refused = False
        #: everything given so far is in the file (a flush since the last write)
        self.flushed = True

    @classmethod
    def open(cls, path: Any, fd: int) -> "DirectAppender | None":
        """An appender for the file ``fd`` was opened on (``path``, empty: just created
        or truncated), or ``None`` where ``O_DIRECT`` is not available: no such flag
        (not Linux), not a regular file, or refused by the file system."""
        flag = getattr(os, "O_DIRECT", 0)
        try:
            if not flag or not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size:
                return None
            direct_fd = os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            return cls(fd, direct_fd)
        except (OSError, ValueError):  # no memory for the buffer
            os.close(direct_fd)
            return None

    @property
    def end(self) -> int:
        """The file's size once everything given so far is written (bytes)."""
        return self.base + self.fill

    def write(self, data: Any) -> None:
        """Append ``data`` (any bytes-like object)."""
        n = len(data)
        if not n:
            return
        self.flushed = False
        if self.refused:
            self._plain(data)
            return
        fill = self.fill
        if fill + n <= CHUNK:
            self.view[fill:fill + n] = data
            self.fill = fill + n
            if fill + n == CHUNK:
                self._blocks()
            return
        data = memoryview(data).cast("B")
        pos = 0
        while pos < n:
            k = min(n - pos, CHUNK - self.fill)
            self.view[self.fill:self.fill + k] = data[pos:pos + k]
            self.fill += k
            pos += k
            if self.fill == CHUNK:
                self._blocks()
                if self.refused:
                    self._plain(data[pos:])
                    return

    def write_parts(self, parts: list) -> None:
        """Append each of ``parts`` (a list of bytes-like objects; it is read twice),
        in order: :meth:`write` of each, in one call where they fit in the buffer as
        it is (a capture line is several pieces, most of them small)."""
        fill = self.fill
        if fill + sum(map(len, parts)) >= CHUNK or self.refused:
            for part in parts:
                self.write(part)
            return
        view = self.view
        for part in parts:
            n = fill + len(part)
            view[fill:n] = part
            fill = n
        if fill != self.fill:
            self.fill = fill
            self.flushed = False

    def flush(self) -> None:
        """Make the file hold everything given so far (the part of a block through
        ``fd``)."""
        if self.flushed:
            return
        if not self.refused:
            if self.fill >= BLOCK:
                self._blocks()
            if not self.refused and self.fill:
                _pwrite_all(self.fd, self.view[:self.fill], self.base)
        self.flushed = True

    def close(self) -> None:
        """:meth:`flush`, then let go of the ``O_DIRECT`` descriptor and the buffer
        (``fd`` stays open: it is the caller's). A second call does nothing.

        Raises:
            OSError: the flush failed (the descriptor and the buffer are let go
                anyway).
        """
        if self.direct_fd < 0:
            return
        try:
            self.flush()
        finally:
            os.close(self.direct_fd)
            self.direct_fd = -1
            try:
                self.view.release()
                self.buf.close()
            except BufferError:  # a view of it lives on (in a traceback): freed with it
                pass

    def _blocks(self) -> None:
        """Write the buffer's whole blocks with O_DIRECT; the rest moves to its start."""
        whole = self.fill - self.fill % BLOCK
        try:
            _pwrite_all(self.direct_fd, self.view[:whole], self.base)
        except OSError as e:
            if e.errno not in _REFUSED or self.base:
                raise
            self._refuse()  # the first write: the file system does not take O_DIRECT
            return
        rest = self.fill - whole
        if rest:
            self.view[:rest] = bytes(self.view[whole:self.fill])
        self.base += whole
        self.fill = rest

    def _refuse(self) -> None:
        self.refused = True
        _pwrite_all(self.fd, self.view[:self.fill], self.base)
        os.lseek(self.fd, self.base + self.fill, os.SEEK_SET)
        self.base += self.fill
        self.fill = 0

    def _plain(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        self.base += view.nbytes
        while view:
            view = view[os.write(self.fd, view):]


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset``, resuming after short writes."""
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n
