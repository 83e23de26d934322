"""Capturing in a child process, off the proxy's event loop.

:class:`CaptureProcess` is a pipeline addon with the same hooks and the same output
as :class:`~kinspect.capture.CaptureWriter`, but the costly part of a capture (base64
of every frame, JSON, redaction, the file writes) runs in a child process running a
``CaptureWriter``, on another core. The proxy's side only hands each frame on: a
small header plus the frame bytes, written to a non-blocking pipe in batches:
once :data:`BATCH_BYTES` are waiting (at the next event-loop iteration), else
:data:`BATCH_DELAY` seconds after the first frame of the batch (``os.writev`` of
everything handed on meanwhile, up to IOV_MAX pieces per call; when the pipe is
full the rest waits for it to drain, watched by the event loop). Each write wakes
the child: once per request/response turnaround that costs the proxy more than
the rest of the hand-off (measured in BENCHMARKS.md, Proxy), so small frames are
handed on a few dozen times per second rather than at every turnaround. The child
buffers lines for up to a second before writing the file anyway.

Messages on the pipe: ``>II`` (header length, payload length), the header (a
:mod:`marshal` tuple: parent and child run the same interpreter), the payload (the
frame, then the sent frame when it differs).

Guarantees:

* Complete while both run: nothing handed on is dropped. When the child falls
  behind, the bytes waiting for it count in :attr:`CaptureProcess.backlog_bytes`,
  which the pipeline adds to its own backlog, so the proxy pauses reading
  (``Proxy.overload``) instead of queuing without bound (see
  :class:`~kinspect.proxy.pipeline.Pipeline`). If the child dies, the capture stops
  there (one logged error) and the proxy goes on.
* Whole lines: the child flushes whole lines only, and on end of input (the proxy
  closed the pipe, or exited, even by SIGKILL) it writes everything it received and
  closes the file; frames still queued in a killed proxy (at most the last
  ``BATCH_DELAY`` seconds' or ``BATCH_BYTES``) are lost. The child runs
  in its own session, so a Ctrl-C meant for the proxy does not cut it short.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import marshal
import os
import select
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

_HDR = struct.Struct(">II")
_marshal_dumps = marshal.dumps
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 120.0
#: bytes handed on after which they are written to the pipe at the next loop iteration
BATCH_BYTES = 256 << 10
#: seconds after which frames handed on are written to the pipe, however few
BATCH_DELAY = 0.01


class CaptureProcess(CaptureHooks):
    """Pipeline addon writing a capture file through a child process.

    Args: as :class:`~kinspect.capture.CaptureWriter` (``path``, ``codec``,
        ``upstream``, ``listen``, ``secrets``, ``max_bytes``, ``start_ns``); the
        child loads the same spec sources as ``codec`` (specs added in memory are
        not seen there, so redaction knows only the APIs those sources define).

    Attributes:
        path, secrets, max_bytes, gzip: as given.
        frames: frame lines handed to the child so far.
        lines, redacted, paths: as the child reports them when closed (before that:
            0, 0 and the first part's path).
        backlog_bytes: bytes handed on but not yet taken by the child.
        pause_bytes: backlog beyond which the pipeline pauses the proxy (16 MiB), so
            the capture never lags far behind the traffic.

    Raises:
        CaptureError: the child cannot start or cannot create the file.
    """

    def __init__(self, path: str | os.PathLike, codec: Codec | None = None, *,
                 upstream: str = "", listen: str = "", secrets: bool = False,
                 max_bytes: int | None = None, start_ns: int | None = None):
        self.path = Path(path)
        self.secrets = secrets
        self.max_bytes = max_bytes
        self.gzip = self.path.name.endswith(".gz")
        self.frames = 0
        self.lines = 0
        self.redacted = 0
        self.paths: list[Path] = [self.path]
        self.backlog_bytes = 0
        self.pause_bytes = 16 << 20
        self._closed = False
        codec = codec or Codec()
        sources = [{"path": s.path, "kind": s.kind, "origin": s.origin}
                   for s in getattr(codec.registry, "sources", [])]
        config = {"path": str(self.path), "upstream": upstream, "listen": listen,
                  "secrets": secrets, "max_bytes": max_bytes, "sources": sources,
                  "start_ns": start_ns if start_ns is not None else time.time_ns()}
        r, w = os.pipe()
        _grow_pipe(w)
        # the child imports this very kinspect, wherever it was imported from
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kinspect.capture_process", json.dumps(config)],
                stdin=r, stdout=subprocess.PIPE, stderr=None, start_new_session=True,
                env=env)
        except OSError as e:
            os.close(r)
            os.close(w)
            raise CaptureError(f"cannot start the capture process: {e}", self.path) from None
        os.close(r)
        self._fd = w
        ready = self._proc.stdout.readline() if _readable(self._proc.stdout, _START_TIMEOUT) \
            else b""
        if not ready.startswith(b"ready"):
            os.close(w)
            self._proc.kill()
            self._proc.communicate()
            reason = ready.decode(errors="replace").strip() or "it exited without a word"
            raise CaptureError(f"capture process failed: {reason}", self.path)
        os.set_blocking(w, False)
        #: pieces handed on and not yet in the pipe
        self._out: list = []
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
        self._out += (_HDR.pack(len(h), n), h, *payload)
        self.backlog_bytes += 8 + len(h) + n
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
            if self.backlog_bytes >= BATCH_BYTES:
                self._scheduled = True
                loop.call_soon(self._write)
            elif self._timer is None:
                self._timer = loop.call_later(BATCH_DELAY, self._on_timer)
        return True

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
                self.backlog_bytes -= n
                i = _advance(out, 0, n)
                del out[:i]
                if i < chunk:  # the pipe is full
                    break
        except BlockingIOError:
            pass
        except OSError as e:  # the child is gone: say so once, stop capturing
            self._fail(e)
            return False
        return True

    def _write_blocking(self) -> None:
        """Write everything, waiting for the pipe (no event loop involved)."""
        while self._out and not self._broken:
            if not select.select([], [self._fd], [], _STOP_TIMEOUT)[1]:
                self._fail(TimeoutError(f"pipe not writable for {_STOP_TIMEOUT:.0f} s"))
                return
            self._write_some()

    def _fail(self, e: BaseException) -> None:
        self._broken = True
        self._out.clear()
        self.backlog_bytes = 0
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
                  -1 if sent is None else len(sent))
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
        for line in out.splitlines():
            if line.startswith(b"{"):
                info = json.loads(line)
                self.lines = info["lines"]
                self.redacted = info["redacted"]
                self.paths = [Path(p) for p in info["paths"]]
        if self._proc.returncode != 0:
            log.error("capture process exited with status %s", self._proc.returncode)


def _grow_pipe(fd: int) -> None:
    """Give the pipe 1 MiB of buffer where Linux allows (default 64 KiB), so large
    frames rarely wait for the child."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass


def _readable(fh: Any, timeout: float) -> bool:
    return bool(select.select([fh], [], [], timeout)[0])


# ---------------------------------------------------------------------------
# the child
# ---------------------------------------------------------------------------

class _Conn:
    __slots__ = ("id", "client", "upstream_addr", "opened")


def _child(config: dict[str, Any]) -> int:
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
    out.write(b"ready\n")
    out.flush()
    try:
        torn = _copy_input(writer)
    finally:  # whatever happened, the lines received so far reach the file
        writer.close()
    if torn:
        print(f"kinspect capture process: input ended inside a message ({torn} bytes "
              f"dropped)", file=sys.stderr, flush=True)
    out.write(json.dumps({"lines": writer.lines, "frames": writer.frames,
                          "redacted": writer.redacted,
                          "paths": [str(p) for p in writer.paths]}).encode() + b"\n")
    out.flush()
    return 0


def _copy_input(writer: Any) -> int:
    """Turn every message on stdin into capture lines until end of input; returns
    the bytes of a torn last message (0 normally)."""
    fd = sys.stdin.buffer.fileno()
    buf = bytearray()
    pos = 0
    interval = writer.flush_interval
    while True:
        if not select.select([fd], [], [], interval)[0]:
            writer.flush()  # quiet for a while: write the lines buffered so far
            continue
        chunk = os.read(fd, 4 << 20)
        if not chunk:
            return len(buf)
        buf += chunk
        view = memoryview(buf)
        try:
            while len(buf) - pos >= 8:
                hlen, plen = _HDR.unpack_from(buf, pos)
                end = pos + 8 + hlen + plen
                if end > len(buf):
                    break
                header = marshal.loads(view[pos + 8:pos + 8 + hlen])
                payload = bytes(view[pos + 8 + hlen:end])
                pos = end
                _apply(writer, header, payload)
        finally:
            view.release()
        if pos:
            del buf[:pos]
            pos = 0


def _apply(writer: Any, h: tuple, payload: bytes) -> None:
    if h[0] == "c":
        _, event, ts, conn_id, client, upstream = h
        conn = _Conn()
        conn.id, conn.client, conn.upstream_addr, conn.opened = conn_id, client, upstream, ts
        writer._conn_line(conn, event, ts)
        return
    (_, ts, conn_id, direction, client, upstream, flow_id, api_key, api_version, corr, flags,
     fl, sl) = h
    flow = Flow(flow_id, conn_id, client, upstream, api_key, api_version, corr, "", b"", ts)
    flow.flags = set(flags)
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
              else f"kinspect capture process: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
