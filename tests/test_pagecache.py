"""Drop-behind for capture files (kinspect.pagecache): written pages leave the page
cache once on disk, content is untouched, and files that are not regular turn it
off quietly."""

from __future__ import annotations

import ctypes
import errno
import gzip
import mmap
import os
import subprocess
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


# ---------------------------------------------------------------------------
# O_DIRECT (DirectAppender)
# ---------------------------------------------------------------------------

def _direct_dir(tmp_path: Path) -> Path:
    """A disk-backed directory whose file system takes O_DIRECT writes of whole
    blocks and refuses misaligned ones with EINVAL (ext4, XFS: what the refusal
    test needs)."""
    seen = []
    for d in (tmp_path, ROOT / "build"):
        d.mkdir(exist_ok=True)
        kind = _fs_type(d.resolve())
        if kind in ("tmpfs", "ramfs", ""):
            seen.append(f"{d}: {kind or 'unknown'}")
            continue
        probe = d / "o_direct.probe"
        buf = mmap.mmap(-1, 4096)
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
            try:
                whole = os.pwrite(fd, buf, 0) == 4096
                try:
                    os.pwrite(fd, memoryview(buf)[:1000], 4096)
                    refuses = False
                except OSError as e:
                    refuses = e.errno == errno.EINVAL
            finally:
                os.close(fd)
        except OSError as e:
            seen.append(f"{d}: {kind}, O_DIRECT refused ({e})")
            continue
        finally:
            buf.close()
            probe.unlink(missing_ok=True)
        if whole and refuses:
            return d
        seen.append(f"{d}: {kind}, whole blocks written: {whole}, misaligned refused: "
                    f"{refuses}")
    raise AssertionError("no directory on a file system that takes O_DIRECT as ext4 and "
                         "XFS do: " + "; ".join(seen))


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this system")
def test_direct_appender_writes_whole_blocks_then_the_rest_at_flush(tmp_path, monkeypatch):
    """Pieces of every size (some larger than the buffer), alone or several at once
    (write_parts), reach the file: whole blocks as the buffer fills, the rest at each
    flush; the file always holds a prefix of what was given, and after each flush
    all of it."""
    import random

    monkeypatch.setattr(pagecache, "CHUNK", 8 * pagecache.BLOCK)
    path = _direct_dir(tmp_path) / "direct.bin"
    rnd = random.Random(7)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    given = bytearray()
    try:
        a = pagecache.DirectAppender.open(path, fd)
        assert a is not None and _flags(a.direct_fd) & os.O_DIRECT
        for i in range(300):
            if i % 3 == 2:  # several pieces in one call, as a capture line goes in
                parts = [os.urandom(rnd.choice([0, 1, 17, 300, 4095, 5000, 40_000]))
                         for _ in range(rnd.randint(1, 5))]
                a.write_parts([p if j % 2 else memoryview(p) for j, p in enumerate(parts)])
                piece = b"".join(parts)
            else:
                piece = os.urandom(rnd.choice([0, 1, 17, 4095, 4096, 5000, 40_000, 100_000]))
                a.write(piece if i % 2 else memoryview(piece))
            given += piece
            on_disk = path.read_bytes()
            assert given.startswith(on_disk)
            assert len(on_disk) % pagecache.BLOCK == 0 or a.base < len(on_disk) <= a.end
            assert a.end - len(on_disk) < 9 * pagecache.BLOCK  # at most a buffer behind
            if rnd.random() < 0.2:
                a.flush()
                assert path.read_bytes() == given
        assert not a.refused
        a.close()
        assert path.read_bytes() == given
        assert os.fstat(fd).st_size == len(given)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux page cache calls")
def test_direct_appender_leaves_the_page_cache_alone(tmp_path):
    """What goes out by O_DIRECT is not cached (the point of it): of 8 MiB written,
    only the last partial block, written through the page cache at the flush, may
    be."""
    path = _direct_dir(tmp_path) / "uncached.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        a = pagecache.DirectAppender.open(path, fd)
        assert a is not None
        data = os.urandom((8 << 20) + 1000)
        for i in range(0, len(data), 100_000):
            a.write(data[i:i + 100_000])
        a.close()
        res = _resident(fd, len(data))
        assert sum(res) <= 1, f"{sum(res)} of {len(res)} pages cached"
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.read(fd, len(data) + 1) == data
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this system")
def test_o_direct_refused_at_the_first_write_goes_on_through_the_page_cache(
        tmp_path, monkeypatch):
    """A file system refusing the writes (here ext4/XFS refusing blocks of a size it
    cannot take: EINVAL) turns the appender into plain writes with nothing lost, and
    a CaptureWriter goes on by itself (drop-behind included)."""
    d = _direct_dir(tmp_path)
    monkeypatch.setattr(pagecache, "BLOCK", 1000)
    monkeypatch.setattr(pagecache, "CHUNK", 3000)
    path = d / "refused.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        a = pagecache.DirectAppender.open(path, fd)
        assert a is not None
        first = os.urandom(2500)
        a.write(first)
        assert not a.refused  # nothing written yet
        second = os.urandom(5010)
        a.write(second)  # fills the buffer: the first write
        assert a.refused
        a.write(b"tail")
        a.close()
        assert path.read_bytes() == first + second + b"tail"
        assert os.lseek(fd, 0, os.SEEK_CUR) == 7514
    finally:
        os.close(fd)
    frames = [os.urandom(900 + i) for i in range(30)]
    w = CaptureWriter(d / "cap.jsonl", Codec(), secrets=True)
    appender = w._direct
    assert appender is not None
    for i, fr in enumerate(frames):
        w.write_frame(Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", fr, i), "req",
                      fr, None, i)
    assert w._direct is None  # refused: the writer went on without it
    assert appender.direct_fd == -1  # and let go of its descriptor
    w.close()
    import base64
    got = [r for r in read_capture(d / "cap.jsonl") if r.get("type") == "frame"]
    assert [base64.b64decode(r["frame"]) for r in got] == frames


@pytest.mark.parametrize("max_bytes", [None, 200_000])
def test_capture_through_o_direct_is_byte_for_byte_the_page_cache_one(tmp_path, max_bytes):
    """The same frames written with and without O_DIRECT give the same files (every
    rotated part), and the O_DIRECT writer really used it."""
    d = _direct_dir(tmp_path)
    frames = [os.urandom(n) for n in (10, 5000, 3 << 20, 70_000, 1, 9 << 20, 123)] * 3
    out = {}
    for direct in (True, False):
        w = CaptureWriter(d / f"cap-{direct}.jsonl", Codec(), upstream="u:1", listen="l:1",
                          secrets=True, max_bytes=max_bytes, start_ns=1, direct=direct)
        assert (w._direct is not None) is direct
        if direct:
            assert _flags(w._direct.direct_fd) & os.O_DIRECT
        for i, fr in enumerate(frames):
            w.write_frame(Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", fr, i),
                          "req", fr, fr + b"!" if i % 3 == 0 else None, i)
        w.close()
        out[direct] = [p.read_bytes() for p in w.paths]
    assert len(out[True]) == len(out[False]) > (1 if max_bytes else 0)
    assert out[True] == out[False]


def test_a_write_error_is_raised_once_and_lets_go_of_the_file(tmp_path):
    """A real write error (the file-size limit, RLIMIT_FSIZE: EFBIG, in a child
    process) comes out of the capture writer as that OSError, the file keeps a
    prefix of the lines, no descriptor is left open, and closing again is a no-op;
    both with O_DIRECT and through the page cache."""
    d = _direct_dir(tmp_path)
    script = r'''
import os, resource, signal, sys
from kinspect.capture import CaptureWriter
from kinspect.codec import Codec
from kinspect.flows import Flow
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path, direct = sys.argv[1], sys.argv[2] == "1"
codec = Codec()
fds = set(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
w = CaptureWriter(path, codec, secrets=True, direct=direct, flush_lines=1)
assert (w._direct is not None) == direct
errors = []
try:
    for i in range(40):
        fr = os.urandom(100_000)
        w.write_frame(Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", fr, i), "req",
                      fr, None, i)
except OSError as e:
    errors.append(e)
try:
    w.close()  # what is still buffered cannot be written either
except OSError as e:
    errors.append(e)
assert errors and all(type(e) is OSError and e.errno == 27 for e in errors), errors  # EFBIG
w.close()  # again: nothing
left = set(os.listdir("/proc/self/fd")) - fds
assert not left, left
print("ok", os.path.getsize(path))
'''
    for direct in ("1", "0"):
        path = d / f"efbig-{direct}.jsonl"
        res = subprocess.run([sys.executable, "-c", script, str(path), direct],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-2000:]
        data = path.read_bytes()
        assert 0 < len(data) <= 1 << 20
        lines = data.split(b"\n")
        assert all(line.startswith(b"{") and line.endswith(b"}") for line in lines[:-1])
        path.unlink()


def test_flush_due_says_when_buffered_lines_must_reach_the_file(tmp_path):
    """What a writer without an event loop (the capture child) waits on: ``None``
    with nothing buffered, else the seconds left of ``flush_interval`` (0 when
    due); both with O_DIRECT and through the page cache."""
    for direct in (True, False):
        w = CaptureWriter(tmp_path / f"due-{direct}.jsonl", Codec(), secrets=True,
                          flush_interval=30, direct=direct)
        w.flush()
        assert w.flush_due() is None
        fr = b"x" * 100
        w.write_frame(Flow(1, 1, "c:1", "u:1", 18, 3, 1, "ApiVersions", fr, 1), "req", fr,
                      None, 1)
        assert 25 < w.flush_due() <= 30
        w.flush()
        assert w.flush_due() is None
        w.flush_interval = 0.0
        w._pending_since = 0.0  # (as if long ago)
        w.write_frame(Flow(2, 1, "c:1", "u:1", 18, 3, 2, "ApiVersions", fr, 2), "req", fr,
                      None, 2)  # due at once: written by the call itself
        assert w.flush_due() is None
        w.close()
        assert w.flush_due() is None
