"""kinspect.heap: malloc settings that keep large frames' memory for reuse."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Rounds of eight ~1.3 MB buffers alive at once, then all freed: the pattern of a
# proxy joining frames, decoding record batches and base64-encoding captures.
_PROBE = r"""
import json, os, resource, sys
from kinspect.heap import keep_frame_memory
applied = keep_frame_memory()
src = os.urandom(1 << 20)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for warm in range(2):  # the first pass grows the heap; the second is measured
    f0 = faults()
    for _ in range(30):
        blocks = [src + bytes(300_000 + i) for i in range(8)]
        del blocks
print(json.dumps({"applied": applied, "faults": faults() - f0}))
"""


def _probe(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc settings apply to glibc only")
def test_frame_sized_buffers_reuse_the_heap_instead_of_fresh_pages():
    """With the settings, freed frame-sized buffers are reused: the second pass of
    the probe faults in (almost) no new pages. Without them (KINSPECT_MALLOC=0),
    glibc hands the memory back and faults it in again every round."""
    tuned = _probe()
    default = _probe(KINSPECT_MALLOC="0")
    assert tuned["applied"] is True and default["applied"] is False
    assert tuned["faults"] < 2_000, tuned
    # the probe does churn without the settings (else it would prove nothing)
    assert default["faults"] > 10 * tuned["faults"] + 5_000, (tuned, default)


def test_keep_frame_memory_is_applied_once_and_can_be_turned_off():
    from kinspect import heap

    first = heap.keep_frame_memory()
    assert heap.keep_frame_memory() is first  # cached: applied once per process
    assert _probe(KINSPECT_MALLOC="0")["applied"] is False
