"""Capturing in a child process, off the proxy's event loop.

:class:`CaptureProcess` is a pipeline addon with the same hooks and the same output
as :class:`~kinspect.capture.CaptureWriter`, but the costly part of a capture (base64
of every frame, JSON, redaction, the file writes) runs in a child process running a
``CaptureWriter``, on another core. The proxy's side only hands each frame on:

* the frame bytes are copied into a ring of shared memory (:data:`RING_BYTES`, a
  Linux ``memfd`` mapped by both processes) when it has room, and go through the
  pipe with their header otherwise (no ring on this system, a frame larger than
  the room left, the child behind);
* a small header per frame is written to a non-blocking pipe, in batches: once
  :data:`BATCH_BYTES` were handed on (at the next event-loop iteration), else
  :data:`BATCH_DELAY` seconds after the first frame of the batch (``os.writev`` of
  everything queued meanwhile, up to IOV_MAX pieces per call; when the pipe is
  full the rest waits for it to drain, watched by the event loop).

Each pipe write wakes the child: once per request/response turnaround that costs
the proxy more than the rest of the hand-off (measured in BENCHMARKS.md, Proxy), so
small frames are handed on some twenty times per second rather than at every
turnaround. Through the ring, a frame costs one copy on the proxy's side, and the
child base64-encodes it where it lies, instead of two trips through the kernel (pipe
write and read) plus a copy out of the read buffer. The child buffers lines for up to
a second before writing the file anyway.

Messages on the pipe: ``>III`` (header length, payload bytes on the pipe, payload
bytes in the ring), the header (a :mod:`marshal` tuple: parent and child run the
same interpreter), the payload when it is on the pipe (the frame, then the sent
frame when it differs). Ring payloads follow each other in the ring in message
order, wrapping around at its end. The ring's first 8 bytes hold the count of ring
bytes the child has taken (native uint64, written only by the child), which tells
the proxy how much room there is.

Guarantees:

* Complete while both run: nothing handed on is dropped. When the child falls
  behind, the bytes waiting for it (queued for the pipe, or in the ring and not
  yet turned into a line) count in :attr:`CaptureProcess.backlog_bytes`, which the
  pipeline adds to its own backlog, so the proxy pauses reading
  (``Proxy.overload``) instead of queuing without bound (see
  :class:`~kinspect.proxy.pipeline.Pipeline`). If the child dies, the capture stops
  there (one logged error) and the proxy goes on.
* Whole lines: the child flushes whole lines only, and on end of input (the proxy
  closed the pipe, or exited, even by SIGKILL) it writes everything it received and
  closes the file (frames in the ring included: its memory lives as long as
  the child maps it), then exits quietly (a proxy killed outright cannot read its
  counts: they are not reported). A killed proxy loses what it had not handed on
  yet: frames whose headers were still queued (the last ``BATCH_DELAY`` seconds' or
  ``BATCH_BYTES`` while the child keeps up; while it is behind and the pipe is
  full, up to the backlog at which the proxy pauses, 16 MiB) and, before that,
  flows still in the pipeline's batch (see
  :class:`~kinspect.proxy.pipeline.Pipeline`: up to its ``delay``). The child runs
  in its own session, so a Ctrl-C meant for the proxy does not cut it short, and
  ignores SIGTERM, SIGINT and SIGHUP, so neither does a stop signal sent to every
  process of the proxy's service (it ends with its input; SIGKILL still ends it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import marshal
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .capture import _IOV_MAX, CaptureError, CaptureHooks, CaptureWriter, _advance
from .codec import Codec, KinspectError
from .codec.registry import SpecRegistry, SpecSource
from .flows import Flow

log = logging.getLogger("kinspect.capture")

_HDR = struct.Struct(">III")
#: the child's count of ring bytes taken, at the start of the shared memory
_TAKEN = struct.Struct("=Q")
#: where frame bytes start in the shared memory (after the count, on its own cache line)
_RING_DATA = 64
_marshal_dumps = marshal.dumps
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 120.0
#: bytes handed on after which they are written to the pipe at the next loop iteration
BATCH_BYTES = 256 << 10
#: seconds after which frames handed on are written to the pipe, however few (with
#: 10 ms instead, the proxy and the child used 6-10 µs more CPU per round trip at
#: 650 round trips per second, and p99 was no better; BENCHMARKS.md, Proxy). Also
#: what a proxy killed outright may lose on top of the pipeline's batch.
BATCH_DELAY = 0.05
#: bytes of the shared-memory ring frames travel through to the child (Linux)
RING_BYTES = 32 << 20


class CaptureProcess(CaptureHooks):
    """Pipeline addon writing a capture file through a child process.

    Args: as :class:`~kinspect.capture.CaptureWriter` (``path``, ``codec``,
        ``upstream``, ``listen``, ``secrets``, ``max_bytes``, ``start_ns``); the
        child loads the same spec sources as ``codec`` (specs added in memory are
        not seen there, so redaction knows only the APIs those sources define).
        ``ring_bytes``: size of the shared-memory ring (0: frames go through the
        pipe only).

    Attributes:
        path, secrets, max_bytes, gzip: as given.
        frames: frame lines handed to the child so far.
        lines, redacted, paths: as the child reports them when closed (before that:
            0, 0 and the first part's path).
        backlog_bytes: bytes handed on but not yet taken by the child (queued for the
            pipe, or in the ring and not yet turned into a line by the child).
        ring_bytes: size of the ring in use (0 when there is none).
        ring_frames: frames whose bytes went through the ring.
        pause_bytes: backlog beyond which the pipeline pauses the proxy (16 MiB), so
            the capture never lags far behind the traffic.

    Raises:
        CaptureError: the child cannot start or cannot create the file.
    """

    def __init__(self, path: str | os.PathLike, codec: Codec | None = None, *,
                 upstream: str = "", listen: str = "", secrets: bool = False,
                 max_bytes: int | None = None, start_ns: int | None = None,
                 ring_bytes: int = RING_BYTES):
        self.path = Path(path)
        self.secrets = secrets
        self.max_bytes = max_bytes
        self.gzip = self.path.name.endswith(".gz")
        self.frames = 0
        self.lines = 0
        self.redacted = 0
        self.paths: list[Path] = [self.path]
        self.pause_bytes = 16 << 20
        self.ring_frames = 0
        #: bytes queued for the pipe (headers, and frames that are not in the ring)
        self._queued = 0
        self._closed = False
        codec = codec or Codec()
        sources = [{"path": s.path, "kind": s.kind, "origin": s.origin}
                   for s in getattr(codec.registry, "sources", [])]
        config = {"path": str(self.path), "upstream": upstream, "listen": listen,
                  "secrets": secrets, "max_bytes": max_bytes, "sources": sources,
                  "start_ns": start_ns if start_ns is not None else time.time_ns()}
        if not isinstance(ring_bytes, int) or ring_bytes < 0:
            raise ValueError(f"ring_bytes must be an int >= 0, not {ring_bytes!r}")
        ring = _open_ring(ring_bytes)
        ring_fd = ring[0] if ring else -1
        self._ring: mmap.mmap | None = ring[1] if ring else None
        self.ring_bytes = ring_bytes if ring else 0
        #: ring bytes written so far (the next goes at ``_put % ring_bytes``)
        self._put = 0
        #: the child's count of ring bytes taken, as last read
        self._taken = 0
        #: bytes handed on after which the pipe is written (a ring smaller than two
        #: batches would otherwise fill before the child hears of its contents)
        self._batch_limit = min(BATCH_BYTES, self.ring_bytes // 2) if ring else BATCH_BYTES
        config["ring"] = [ring_fd, self.ring_bytes] if ring else None
        try:
            r, w = os.pipe()
        except BaseException:
            self._close_ring(ring_fd)
            raise
        _grow_pipe(w)
        # the child imports this very kinspect, wherever it was imported from
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kinspect.capture_process", json.dumps(config)],
                stdin=r, stdout=subprocess.PIPE, stderr=None, start_new_session=True,
                env=env, pass_fds=(ring_fd,) if ring else ())
        except BaseException as e:
            os.close(r)
            os.close(w)
            self._close_ring(ring_fd)
            if not isinstance(e, OSError):
                raise
            raise CaptureError(f"cannot start the capture process: {e}", self.path) from None
        os.close(r)
        if ring:
            os.close(ring_fd)  # the mappings keep the memory
        self._fd = w
        ready = self._proc.stdout.readline() if _readable(self._proc.stdout, _START_TIMEOUT) \
            else b""
        if not ready.startswith(b"ready"):
            os.close(w)
            self._proc.kill()
            self._proc.communicate()
            self._close_ring()
            reason = ready.decode(errors="replace").strip() or "it exited without a word"
            raise CaptureError(f"capture process failed: {reason}", self.path)
        if ready.strip() != b"ready" and self._ring is not None:
            # the child could not map the ring ("ready without-ring"): pipe only
            log.warning("capture process: %s; frames go through the pipe",
                        ready.decode(errors="replace").strip())
            self._close_ring()
            self.ring_bytes = 0
            self._batch_limit = BATCH_BYTES
        os.set_blocking(w, False)
        #: pieces handed on and not yet in the pipe
        self._out: list = []
        #: bytes handed on (ring included) since the last write to the pipe
        self._batch = 0
        self._loop: Any = None
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._watching = False
        self._broken = False

    # -- the hand-off (event loop side) -------------------------------------------
    def _send(self, header: tuple, *payload: bytes) -> bool:
        if self._closed or self._broken:
            return False
        h = _marshal_dumps(header)
        n = 0
        for piece in payload:
            n += len(piece)
        # (the room last seen only grows as the child takes bytes: read its count
        # afresh only when that room is too small)
        if n and self._ring is not None and (
                n <= self.ring_bytes - (self._put - self._taken) or n <= self._ring_room()):
            self._ring_write(payload)
            self.ring_frames += 1
            self._out += (_HDR.pack(len(h), 0, n), h)
            self._queued += 12 + len(h)
        else:
            self._out += (_HDR.pack(len(h), n, 0), h, *payload)
            self._queued += 12 + len(h) + n
        self._batch += 12 + len(h) + n
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: write now, waiting if need be
            self._write_blocking()
            return True
        if loop is not self._loop:
            # a new event loop (the previous one ended): what was armed on the old
            # one will never run; start afresh here
            self._forget_loop()
            self._loop = loop
        if not self._scheduled and not self._watching:
            if self._batch >= self._batch_limit:
                self._scheduled = True
                loop.call_soon(self._write)
            elif self._timer is None:
                self._timer = loop.call_later(BATCH_DELAY, self._on_timer)
        return True

    @property
    def backlog_bytes(self) -> int:
        """Bytes handed on that the child has not taken yet: queued for the pipe, plus
        those in the ring it has not made a line of (read afresh: the child takes them
        on its own, with no event on this side to tell)."""
        if self._ring is None:
            return self._queued
        n = self._queued + self.ring_bytes - self._ring_room()
        if n > self.pause_bytes >> 1 and not self._closed and not self._broken \
                and self._proc.poll() is not None:
            # the child died holding this much (the proxy is paused on it, or would
            # be): with every header already in the pipe, no write is left to fail
            # and say so, and the pipeline's re-check would wait on it for ever
            self._fail(ChildProcessError(f"it exited with status {self._proc.returncode}"))
            return self._queued
        return n

    def _ring_room(self) -> int:
        """Bytes of the ring free now (the child's count is read until two reads
        agree, so a torn read is never believed).

        The child stores its count after it has made the line from the bytes (its
        last read of them), in program order; the proxy only reuses room the count
        gives back. CPUs commit stores in order after the loads before them (x86-64
        guarantees it; weaker memory models allow otherwise in theory, not in the
        cores Python runs on)."""
        ring = self._ring
        if ring is None:  # closed (or never there): nothing waits in it
            return self.ring_bytes
        unpack = _TAKEN.unpack_from
        try:
            a = unpack(ring, 0)[0]
            while True:
                b = unpack(ring, 0)[0]
                if a == b:
                    break
                a = b
        except ValueError:  # closed meanwhile by close() on another thread
            return self.ring_bytes
        if self._taken < a <= self._put:  # it only grows, and never past what was put
            self._taken = a
        return self.ring_bytes - (self._put - self._taken)

    def _ring_write(self, payload: tuple) -> None:
        """Copy the pieces into the ring after the previous ones (room checked)."""
        ring = self._ring
        size = self.ring_bytes
        put = self._put
        for piece in payload:
            k = len(piece)
            p = put % size
            if p + k <= size:
                ring[_RING_DATA + p:_RING_DATA + p + k] = piece
            else:  # wraps around the end
                first = size - p
                mv = memoryview(piece)
                ring[_RING_DATA + p:_RING_DATA + size] = mv[:first]
                ring[_RING_DATA:_RING_DATA + k - first] = mv[first:]
            put += k
        self._put = put

    def _close_ring(self, fd: int = -1) -> None:
        if fd >= 0:
            os.close(fd)
        ring, self._ring = self._ring, None  # (gone for the loop thread before it closes)
        self._taken = self._put  # the child has taken everything, or never will
        if ring is not None:
            ring.close()

    def _forget_loop(self) -> None:
        old = self._loop
        if old is not None and self._watching and not old.is_closed():
            old.remove_writer(self._fd)
        if self._timer is not None:
            try:
                self._timer.cancel()
            except Exception:  # noqa: BLE001 - a handle of a closed loop may refuse
                pass
        self._timer = None
        self._scheduled = False
        self._watching = False

    def _on_timer(self) -> None:
        self._timer = None
        if not self._scheduled and not self._watching:
            self._write()

    def _write(self) -> None:
        """(On the event loop) write what the pipe takes now; watch it for the rest."""
        self._scheduled = False
        if self._closed:  # closing: the rest is written by close(), nowhere else
            return
        if not self._write_some():
            return
        if self._out and not self._watching:
            self._watching = True
            self._loop.add_writer(self._fd, self._write)
        elif not self._out and self._watching:
            self._watching = False
            self._loop.remove_writer(self._fd)

    def _write_some(self) -> bool:
        """Write pieces until the pipe is full or nothing is left; ``False`` when the
        child is gone."""
        out = self._out
        try:
            while out:
                chunk = len(out) if len(out) < _IOV_MAX else _IOV_MAX
                n = os.writev(self._fd, out[:chunk])
                self._queued -= n
                i = _advance(out, 0, n)
                del out[:i]
                if i < chunk:  # the pipe is full
                    break
        except BlockingIOError:
            pass
        except OSError as e:  # the child is gone: say so once, stop capturing
            self._fail(e)
            return False
        finally:
            self._batch = self._queued
        return True

    def _write_blocking(self) -> None:
        """Write everything, waiting for the pipe (no event loop involved)."""
        while self._out and not self._broken:
            if not select.select([], [self._fd], [], _STOP_TIMEOUT)[1]:
                self._fail(TimeoutError(f"pipe not writable for {_STOP_TIMEOUT:.0f} s"))
                return
            self._write_some()

    def _fail(self, e: BaseException) -> None:
        if isinstance(e, BrokenPipeError) and self._proc.poll() is not None:
            # (the child said why on stderr: a full disk, for instance)
            e = ChildProcessError(f"it exited with status {self._proc.returncode}")
        self._broken = True
        self._out.clear()
        self._queued = 0
        self._batch = 0
        self._taken = self._put  # nothing in the ring will be taken any more
        log.error("capture process stopped taking frames (%s); the capture ends here", e)

    def write_frame(self, flow: Flow, direction: str, frame: bytes, sent: bytes | None,
                    ts_ns: int) -> None:
        """Hand one frame line for ``flow`` to the child (see
        :meth:`CaptureWriter.write_frame <kinspect.capture.CaptureWriter.write_frame>`)."""
        if sent is not None and sent == frame:
            sent = None
        header = ("f", ts_ns, flow.conn, direction, flow.client, flow.upstream, flow.id,
                  flow.api_key, flow.api_version, flow.correlation_id,
                  tuple(sorted(flow.flags)) if flow.flags else (), len(frame),
                  -1 if sent is None else len(sent), tuple(flow.notes) if flow.notes else ())
        if self._send(header, frame) if sent is None else self._send(header, frame, sent):
            self.frames += 1

    def _conn_line(self, conn: Any, event: str, ts: int) -> None:
        self._send(("c", event, ts, conn.id, conn.client, conn.upstream_addr))

    # -- end ------------------------------------------------------------------------
    def close(self) -> None:
        """Send what is queued, end the child's input and wait for it to finish the
        file (blocking; idempotent). Call it from the event loop's thread, or after
        the loop has stopped."""
        if not self._closed:
            self._closed = True
            self._unwatch()
            self._finish()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop (the pipeline uses this)."""
        if not self._closed:
            self._closed = True
            self._unwatch()
            await asyncio.get_running_loop().run_in_executor(None, self._finish)

    def _unwatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watching:
            self._watching = False
            self._loop.remove_writer(self._fd)

    def _finish(self) -> None:
        self._write_blocking()
        os.close(self._fd)
        try:
            out, _ = self._proc.communicate(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
            log.error("capture process did not finish in %.0f s; killed", _STOP_TIMEOUT)
            return
        finally:
            self._close_ring()
        for line in out.splitlines():
            if line.startswith(b"{"):
                info = json.loads(line)
                self.lines = info["lines"]
                self.redacted = info["redacted"]
                self.paths = [Path(p) for p in info["paths"]]
        if self._proc.returncode != 0 and not self._broken:  # (else said already)
            log.error("capture process exited with status %s", self._proc.returncode)


def _grow_pipe(fd: int) -> None:
    """Give the pipe 1 MiB of buffer where Linux allows (default 64 KiB), so large
    frames rarely wait for the child."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass


def _open_ring(size: int) -> tuple[int, mmap.mmap] | None:
    """A ``memfd`` of ``size`` ring bytes (plus the count) and its mapping, or
    ``None`` where there is none (not Linux, no memfd, ``size`` 0).

    The memory is allocated and mapped in full now (``posix_fallocate``,
    ``MAP_POPULATE``), so that no page of the ring is faulted in while traffic
    flows."""
    if size <= 0 or not hasattr(os, "memfd_create"):
        return None
    try:
        fd = os.memfd_create("kinspect-capture-ring", os.MFD_CLOEXEC)
    except OSError:
        return None
    try:
        os.ftruncate(fd, _RING_DATA + size)
        try:
            os.posix_fallocate(fd, 0, _RING_DATA + size)
        except (OSError, AttributeError):  # not supported here: pages come on first use
            pass
        return fd, _map(fd, _RING_DATA + size)
    except (OSError, ValueError, OverflowError):
        os.close(fd)
        return None


def _map(fd: int, length: int) -> mmap.mmap:
    """A shared read-write mapping of ``fd``, its pages mapped at once where the
    system can (``MAP_POPULATE``)."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, length, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _readable(fh: Any, timeout: float) -> bool:
    return bool(select.select([fh], [], [], timeout)[0])


# ---------------------------------------------------------------------------
# the child
# ---------------------------------------------------------------------------

class _Conn:
    __slots__ = ("id", "client", "upstream_addr", "opened")


def _child(config: dict[str, Any]) -> int:
    from .heap import keep_frame_memory

    # The child ends when its input does: the proxy closed the pipe, or exited, even
    # killed outright. A stop signal that reaches it as well as the proxy (a service
    # manager stopping every process of the unit, kill of a cgroup) must not cut the
    # capture short while the proxy is still handing on its last frames.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    keep_frame_memory()  # the base64 of every large frame: a buffer of that size
    out = sys.stdout.buffer
    try:
        registry = SpecRegistry([SpecSource(**s) for s in config["sources"]])
        writer = CaptureWriter(config["path"], Codec(registry), upstream=config["upstream"],
                               listen=config["listen"], secrets=config["secrets"],
                               max_bytes=config["max_bytes"], start_ns=config["start_ns"])
    except (KinspectError, OSError, ValueError) as e:
        out.write(f"error: {e}\n".encode())
        out.flush()
        return 1
    ring = None
    ready = b"ready\n"
    if config.get("ring"):
        fd, size = config["ring"]
        try:
            ring = _Ring(_map(fd, _RING_DATA + size), size)
        except (OSError, ValueError, OverflowError) as e:  # the proxy then uses the pipe only
            ready = f"ready without-ring: cannot map the ring: {e}\n".encode()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    out.write(ready)
    out.flush()
    try:
        torn = _copy_input(writer, ring)
    finally:  # whatever happened, the lines received so far reach the file
        writer.close()
    if torn:
        print(f"kinspect capture process: input ended inside a message ({torn} bytes "
              f"dropped)", file=sys.stderr, flush=True)
    try:
        out.write(json.dumps({"lines": writer.lines, "frames": writer.frames,
                              "redacted": writer.redacted,
                              "paths": [str(p) for p in writer.paths]}).encode() + b"\n")
        out.flush()
    except BrokenPipeError:
        # the proxy is gone (killed): nobody to tell, the file is complete. Point
        # stdout elsewhere so the exit's own flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return 0


class _Ring:
    """The child's end of the ring: takes payloads in order, counts what it took."""

    __slots__ = ("mem", "size", "taken")

    def __init__(self, mem: mmap.mmap, size: int):
        self.mem = mem
        self.size = size
        self.taken = 0

    def peek(self, n: int) -> memoryview | bytes:
        """The next ``n`` bytes: a view into the ring where they lie in one piece (no
        copy), else a copy of the two pieces. Their room is given back by
        :meth:`release` (``n`` again), once nothing uses the view any more."""
        mem, size = self.mem, self.size
        p = self.taken % size
        if p + n <= size:
            return memoryview(mem)[_RING_DATA + p:_RING_DATA + p + n]
        return mem[_RING_DATA + p:_RING_DATA + size] + mem[_RING_DATA:_RING_DATA + n - size + p]

    def release(self, n: int) -> None:
        """Give the room of the next ``n`` bytes back to the proxy."""
        self.taken += n
        _TAKEN.pack_into(self.mem, 0, self.taken)


def _copy_input(writer: Any, ring: _Ring | None = None) -> int:
    """Turn every message on stdin into capture lines until end of input; returns
    the bytes of a torn last message (0 normally)."""
    fd = sys.stdin.buffer.fileno()
    buf = bytearray()
    pos = 0
    interval = writer.flush_interval
    while True:
        due = writer.flush_due()
        if not select.select([fd], [], [], interval if due is None else due)[0]:
            writer.flush()  # quiet for a while: write the lines buffered so far
            continue
        chunk = os.read(fd, 4 << 20)
        if not chunk:
            return len(buf)
        buf += chunk
        view = memoryview(buf)
        try:
            while len(buf) - pos >= 12:
                hlen, plen, rlen = _HDR.unpack_from(buf, pos)
                end = pos + 12 + hlen + plen
                if end > len(buf):
                    break
                header = marshal.loads(view[pos + 12:pos + 12 + hlen])
                if rlen:
                    if ring is None:
                        raise CaptureError("a frame in a ring this process does not have",
                                           writer.path)
                    payload = ring.peek(rlen)
                else:
                    payload = view[pos + 12 + hlen:end]
                pos = end
                # the line is made from views of the ring or of the input buffer (the
                # base64 is the only copy); nothing keeps them past the call
                try:
                    _apply(writer, header, payload)
                finally:
                    if isinstance(payload, memoryview):
                        payload.release()
                    if rlen:
                        ring.release(rlen)
        finally:
            view.release()
        if pos:
            del buf[:pos]
            pos = 0


def _apply(writer: Any, h: tuple, payload: memoryview | bytes) -> None:
    if h[0] == "c":
        _, event, ts, conn_id, client, upstream = h
        conn = _Conn()
        conn.id, conn.client, conn.upstream_addr, conn.opened = conn_id, client, upstream, ts
        writer._conn_line(conn, event, ts)
        return
    (_, ts, conn_id, direction, client, upstream, flow_id, api_key, api_version, corr, flags,
     fl, sl, notes) = h
    flow = Flow(flow_id, conn_id, client, upstream, api_key, api_version, corr, "", b"", ts)
    flow.flags = set(flags)
    flow.notes = list(notes)
    frame = payload[:fl] if sl >= 0 else payload
    sent = payload[fl:] if sl >= 0 else None
    writer.write_frame(flow, direction, frame, sent, ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="(internal) kinspect's capture child process")
    ap.add_argument("config", help="JSON configuration")
    args = ap.parse_args(argv)
    try:
        return _child(json.loads(args.config))
    except Exception as e:  # noqa: BLE001 - e.g. a full disk: one line, not a traceback
        # over the live view (the lines received so far were written: see _child)
        print(f"kinspect capture process: {type(e).__name__}: {e}" if not isinstance(e, OSError)
              else f"kinspect capture process: {e}; the capture ends at its last whole line",
              file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
