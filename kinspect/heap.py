"""Process memory settings for a proxy: glibc malloc settings that keep the memory
of large frames in the process, and a garbage collector that runs less often.

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

import gc
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


#: container objects allocated (net of those freed) between two collections of the
#: youngest generation, for a proxy process (CPython's default is 700)
GC_YOUNG = 10_000


def collect_less() -> bool:
    """Raise the garbage collector's youngest-generation threshold to
    :data:`GC_YOUNG` (the older generations' thresholds stay), unless it is 0
    (``gc.set_threshold(0)`` turns collection off) or higher already, or the
    environment variable ``KINSPECT_GC=0`` is set. Nothing here raises.

    Why: the live view keeps each flow, with its decoded values (some thirty
    container objects), until a redraw shows it or lets it go, four times a second.
    With the default threshold those objects set off a young collection every couple
    of dozen flows and older ones after them: 95-110 ms of collecting over 9,000
    round trips through kinspect-full, against 6-15 ms with this one (BENCHMARKS.md,
    Proxy). Without the view, flows are freed as soon as the pipeline is done with
    them and collections are rare either way. The price: cyclic garbage, which a
    proxy makes little of, waits longer to be collected.

    Returns:
        whether the threshold is now at least :data:`GC_YOUNG`.
    """
    if os.environ.get("KINSPECT_GC", "1") == "0":
        return False
    young, older, oldest = gc.get_threshold()
    if young == 0:  # collection is off (gc.set_threshold(0)): leave it so
        return False
    if young < GC_YOUNG:
        gc.set_threshold(GC_YOUNG, older, oldest)
    return True
