"""Drop-behind for capture files (kinspect.pagecache): written pages leave the page
cache once on disk, content is untouched, and files that are not regular turn it
off quietly."""

from __future__ import annotations

import ctypes
import gzip
import mmap
import os
import sys
from pathlib import Path

import pytest

import kinspect.pagecache as pagecache
from kinspect.capture import CaptureWriter, read_capture
from kinspect.codec import Codec
from kinspect.flows import Flow
from kinspect.pagecache import DropBehind

ROOT = Path(__file__).resolve().parents[1]
PAGE = mmap.PAGESIZE


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mounts)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        if str(path).startswith(mount.rstrip("/") + "/") or str(path) == mount:
            if len(mount) >= len(best):
                best, kind = mount, fields[2]
    return kind


def _disk_dir(tmp_path: Path) -> Path:
    """A directory on a file system with a page cache to drop (tmpfs keeps its pages:
    they are the files)."""
    for d in (tmp_path, ROOT / "build"):
        d.mkdir(exist_ok=True)
        if _fs_type(d.resolve()) not in ("tmpfs", "ramfs", ""):
            return d
    raise AssertionError(f"no disk-backed directory to test drop-behind in: {tmp_path} is "
                         f"{_fs_type(tmp_path)}, {ROOT / 'build'} is {_fs_type(ROOT / 'build')}")


def _resident(fd: int, size: int) -> list[bool]:
    """Per page of the file's first ``size`` bytes: whether it is in the page cache
    (mincore(2) over a shared mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return [bool(v & 1) for v in vec]
        finally:
            del anchor
    finally:
        mm.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page cache calls")
def test_pages_written_out_leave_the_cache_and_the_last_lag_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(pagecache, "STEP", 64 << 10)
    monkeypatch.setattr(pagecache, "LAG", 256 << 10)
    path = _disk_dir(tmp_path) / "drop-behind.bin"
    chunk = os.urandom(64 << 10)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        d = DropBehind(fd)
        assert d._sync is not None and d._advise
        end = 0
        for _ in range(32):  # 2 MiB
            end += os.write(fd, chunk)
            os.fsync(fd)  # on disk now: the advice may drop these pages
            d.wrote(end)
        assert d.started == end and d.dropped == end - (256 << 10)
        res = _resident(fd, end)
        dropped = res[:d.dropped // PAGE]
        kept = res[d.dropped // PAGE:]
        assert not any(dropped), f"{sum(dropped)} of {len(dropped)} pages still cached"
        # (the kernel may reclaim a few under memory pressure, not the advice)
        assert sum(kept) >= 0.9 * len(kept), \
            f"{kept.count(False)} of the last {len(kept)} pages dropped too soon"
        d.close()
        assert not any(_resident(fd, end))  # all on disk: all let go
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.read(fd, end + 1) == chunk * 32
    finally:
        os.close(fd)
        path.unlink()


def test_a_pipe_turns_drop_behind_off_without_an_error():
    r, w = os.pipe()
    try:
        d = DropBehind(w)
        d.wrote(100 << 20)
        d.wrote(200 << 20)
        d.close()
        assert d._sync is None and not d._advise
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("name", ["cap.jsonl", "cap.jsonl.gz"])
def test_capture_lines_are_intact_across_many_drop_steps(tmp_path, monkeypatch, name):
    """A capture written with tiny steps (many write-out requests and drops, rotation
    included) reads back frame for frame."""
    monkeypatch.setattr(pagecache, "STEP", 4096)
    monkeypatch.setattr(pagecache, "LAG", 8192)
    path = _disk_dir(tmp_path) / name
    frames = [os.urandom(300 + i * 37) for i in range(400)]
    w = CaptureWriter(path, Codec(), upstream="u:1", listen="l:1", secrets=True,
                      max_bytes=120_000)
    w.flush_lines = 7
    for i, fr in enumerate(frames):
        f = Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", fr, i)
        w.write_frame(f, "req", fr, None, i)
    w.close()
    assert len(w.paths) > 3
    if name.endswith(".gz"):
        gzip.decompress(w.paths[0].read_bytes())  # each part is a whole gzip stream
    got = [r for r in read_capture(path) if r.get("type") == "frame"]
    import base64
    assert [base64.b64decode(r["frame"]) for r in got] == frames
    for p in w.paths:
        p.unlink()
