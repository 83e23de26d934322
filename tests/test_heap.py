"""kinspect.heap: malloc settings that keep large frames' memory for reuse, and the
proxy's garbage collector threshold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinspect.heap import _is_glibc

ROOT = Path(__file__).resolve().parents[1]

# Rounds of eight ~1.3 MB buffers alive at once, then all freed: the pattern of a
# proxy joining frames, decoding record batches and base64-encoding captures.
_PROBE = r"""
import json, os, resource, sys
from kinspect.heap import keep_frame_memory
applied = keep_frame_memory()
again = keep_frame_memory()
src = os.urandom(1 << 20)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for warm in range(2):  # the first pass grows the heap; the second is measured
    f0 = faults()
    for _ in range(30):
        blocks = [src + bytes(300_000 + i) for i in range(8)]
        del blocks
print(json.dumps({"applied": applied, "again": again, "faults": faults() - f0}))
"""


def _probe(malloc: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(PYTHONPATH=str(ROOT), KINSPECT_MALLOC=malloc)
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _is_glibc(),
                    reason="malloc settings apply to glibc only")
def test_frame_sized_buffers_reuse_the_heap_instead_of_fresh_pages():
    """With the settings, freed frame-sized buffers are reused: the second pass of
    the probe faults in (almost) no new pages. Without them (KINSPECT_MALLOC=0),
    glibc hands the memory back and faults it in again every round."""
    tuned = _probe("1")
    default = _probe("0")
    assert tuned["applied"] is True and tuned["again"] is True  # applied once, stays
    assert default["applied"] is False
    assert tuned["faults"] < 2_000, tuned
    if not _huge_pages_always():  # (huge pages fault far fewer times either way)
        # the probe does churn without the settings, else it would prove nothing
        assert default["faults"] > 10 * tuned["faults"] + 5_000, (tuned, default)


def test_keep_frame_memory_never_raises_without_ctypes():
    """A Python without ctypes (built without libffi) runs as it would have: the
    settings are not applied and nothing raises (the proxy and the capture child
    call this at start-up)."""
    code = ("import sys; sys.modules['ctypes'] = None\n"
            "from kinspect.heap import keep_frame_memory\n"
            "print(keep_frame_memory())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "KINSPECT_MALLOC": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


_GC_PROBE = r"""
import gc, json, sys
gc.set_threshold(*json.loads(sys.argv[1]))
from kinspect.proxy.server import install_uvloop
install_uvloop()
print(json.dumps(gc.get_threshold()))
"""


@pytest.mark.parametrize("before, env, after", [
    ((700, 10, 10), "1", (10_000, 10, 10)),      # the default: raised, older ones kept
    ((700, 5, 20), "1", (10_000, 5, 20)),
    ((50_000, 10, 10), "1", (50_000, 10, 10)),   # higher already: left alone
    ((0, 10, 10), "1", (0, 10, 10)),             # collection off: left off
    ((700, 10, 10), "0", (700, 10, 10)),         # KINSPECT_GC=0
])
def test_a_proxy_process_collects_garbage_less_often(before, env, after):
    """install_uvloop() (what `kinspect proxy` runs first) raises the young
    generation's threshold to GC_YOUNG, and only that."""
    out = subprocess.run([sys.executable, "-c", _GC_PROBE, json.dumps(before)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "KINSPECT_GC": env})
    assert out.returncode == 0, out.stderr
    assert tuple(json.loads(out.stdout)) == after
