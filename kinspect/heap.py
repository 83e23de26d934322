"""Keeping the memory of large frames in the process (glibc malloc settings).

The proxy and its capture child allocate and free buffers of frame size all the
time: a frame joined from the chunks it arrived in, the record batches a decode
copies out, the base64 of a captured frame. glibc's malloc serves a block above its
mmap threshold with a fresh ``mmap`` (the threshold starts at 128 KiB and follows
the sizes freed, up to 32 MiB), and gives the top of the heap back to the system
once more than twice the threshold is free there. A stream of megabyte frames keeps
landing on both: each buffer then comes on fresh pages, which the kernel faults in
and zeroes one by one, and on a virtual machine whose host backs guest memory on
first touch that costs far more than the copy itself (measured in BENCHMARKS.md,
Proxy: the capture child's system time fell from 0.19–0.21 s to 0.08–0.09 s per
200 MB).

:func:`keep_frame_memory` fixes both limits instead: blocks up to
:data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD` of free
heap is kept for the next frames. The price: after a burst of large frames, up to
that much free memory at the top of the heap stays in the process (its RSS) until
it is needed again.
"""

from __future__ import annotations

import os
import sys

#: blocks up to this size come from the heap (glibc's largest allowed value)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap kept for reuse, bytes
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3

_applied: bool | None = None


def keep_frame_memory() -> bool:
    """Apply :data:`MMAP_THRESHOLD` and :data:`TRIM_THRESHOLD` to this process's
    malloc, once. Only with glibc (elsewhere, with the environment variable
    ``KINSPECT_MALLOC=0``, or when ctypes is missing, nothing changes; nothing here
    raises).

    Returns:
        whether the settings are in force.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("KINSPECT_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:  # a tuning step: whatever fails here, the process runs as it would have
        if not _is_glibc():
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        _applied = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and
                    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    except Exception:  # noqa: BLE001 - e.g. a Python built without ctypes
        _applied = False
    return _applied


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):
        return False
