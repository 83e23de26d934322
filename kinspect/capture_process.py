"""Capturing in a child process, off the proxy's event loop.

:class:`CaptureProcess` is a pipeline addon with the same hooks and the same output
as :class:`~kinspect.capture.CaptureWriter`, but the costly part of a capture (base64
of every frame, JSON, redaction, the file writes) runs in a child process running a
``CaptureWriter``, on another core. The proxy's side only hands each frame on:
a small JSON header plus the frame bytes, written to a pipe by a writer thread
(``os.writev`` releases the GIL, so the event loop does not wait for the child).

Messages on the pipe: ``>II`` (header length, payload length), the header (UTF-8
JSON), the payload (the frame, then the sent frame when it differs).

Guarantees:

* Complete: nothing is dropped. When the child falls behind, the bytes waiting for
  it count in :attr:`CaptureProcess.backlog_bytes`, which the pipeline adds to its
  own backlog, so the proxy pauses reading (``Proxy.overload``) instead of queuing
  without bound (see :class:`~kinspect.proxy.pipeline.Pipeline`).
* Whole lines: the child flushes whole lines only, and on end of input (the proxy
  closed the pipe, or exited, even by SIGKILL) it writes what it has and closes the
  file. It runs in its own session, so a Ctrl-C meant for the proxy does not cut
  it short.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from .capture import CaptureError, CaptureWriter, _writev_all
from .codec import Codec, KinspectError
from .codec.registry import SpecRegistry, SpecSource
from .flows import UNPAIRED, Flow

log = logging.getLogger("kinspect.capture")

_HDR = struct.Struct(">II")
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 120.0


class CaptureProcess:
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
        self._closed = False
        codec = codec or Codec()
        sources = [{"path": s.path, "kind": s.kind, "origin": s.origin}
                   for s in getattr(codec.registry, "sources", [])]
        config = {"path": str(self.path), "upstream": upstream, "listen": listen,
                  "secrets": secrets, "max_bytes": max_bytes, "sources": sources,
                  "start_ns": start_ns if start_ns is not None else time.time_ns()}
        r, w = os.pipe()
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
        self._q: deque = deque()
        self._cv = threading.Condition()
        self._writer_error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="kinspect-capture",
                                        daemon=True)
        self._thread.start()

    # -- the hand-off (event loop side) -------------------------------------------
    def _send(self, header: dict[str, Any], *payload: bytes) -> None:
        if self._closed or self._writer_error is not None:
            return
        h = json.dumps(header, separators=(",", ":")).encode()
        n = sum(len(p) for p in payload)
        parts = (_HDR.pack(len(h), n), h, *payload)
        size = 8 + len(h) + n
        with self._cv:
            self._q.append((parts, size))
            self.backlog_bytes += size
            self._cv.notify()

    def write_frame(self, flow: Flow, direction: str, frame: bytes, sent: bytes | None,
                    ts_ns: int) -> None:
        """Hand one frame line for ``flow`` to the child (see
        :meth:`CaptureWriter.write_frame <kinspect.capture.CaptureWriter.write_frame>`)."""
        if sent is not None and sent == frame:
            sent = None
        header = {"t": "f", "ts": ts_ns, "conn": flow.conn, "dir": direction,
                  "client": flow.client, "upstream": flow.upstream, "flow": flow.id,
                  "api_key": flow.api_key, "api_version": flow.api_version,
                  "corr": flow.correlation_id, "flags": sorted(flow.flags),
                  "fl": len(frame)}
        self.frames += 1
        if sent is None:
            self._send(header, frame)
        else:
            self._send(header, frame, sent)

    def on_connect(self, conn: Any) -> None:
        self._conn(conn, "open", getattr(conn, "opened", None) or time.time_ns())

    def on_disconnect(self, conn: Any) -> None:
        self._conn(conn, "close", getattr(conn, "closed_ns", None) or time.time_ns())

    def _conn(self, conn: Any, event: str, ts: int) -> None:
        self._send({"t": "c", "event": event, "ts": ts, "conn": conn.id,
                    "client": conn.client, "upstream": conn.upstream_addr})

    def on_request(self, flow: Flow) -> None:
        if UNPAIRED in flow.flags:
            return
        self.write_frame(flow, "req", flow.request, flow.request_sent, flow.request_ns)

    def on_flow(self, flow: Flow) -> None:
        if flow.response is None:
            return
        self.write_frame(flow, "resp", flow.response, flow.response_sent,
                         flow.response_ns or time.time_ns())

    # -- the writer thread ----------------------------------------------------------
    def _write_loop(self) -> None:
        fd = self._fd
        q = self._q
        cv = self._cv
        while True:
            with cv:
                while not q:
                    cv.wait()
                batch = list(q)
                q.clear()
            if batch[-1] is None:
                batch.pop()
                stop = True
            else:
                stop = False
            parts: list = []
            for item_parts, _size in batch:
                parts.extend(item_parts)
            try:
                _writev_all(fd, parts)
            except OSError as e:  # the child died: stop, and say so once
                self._writer_error = e
                log.error("capture process stopped taking frames (%s); capture ends here", e)
                stop = True
            with cv:
                self.backlog_bytes -= sum(s for _p, s in batch)
            if stop:
                return

    # -- end ------------------------------------------------------------------------
    def close(self) -> None:
        """Send what is queued, end the child's input and wait for it to finish the
        file (blocking; idempotent)."""
        if not self._closed:
            self._closed = True
            self._finish()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop (the pipeline uses this)."""
        if not self._closed:
            self._closed = True
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, self._finish)

    def _finish(self) -> None:
        with self._cv:
            self._q.append(None)
            self._cv.notify()
        self._thread.join()
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
    except (KinspectError, OSError) as e:
        out.write(f"error: {e}\n".encode())
        out.flush()
        return 1
    out.write(b"ready\n")
    out.flush()
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
            break
        buf += chunk
        while len(buf) - pos >= 8:
            hlen, plen = _HDR.unpack_from(buf, pos)
            end = pos + 8 + hlen + plen
            if end > len(buf):
                break
            header = json.loads(bytes(buf[pos + 8:pos + 8 + hlen]))
            payload = bytes(buf[pos + 8 + hlen:end])
            pos = end
            _apply(writer, header, payload)
        if pos:
            del buf[:pos]
            pos = 0
    writer.close()
    out.write(json.dumps({"lines": writer.lines, "frames": writer.frames,
                          "redacted": writer.redacted,
                          "paths": [str(p) for p in writer.paths]}).encode() + b"\n")
    out.flush()
    return 0


def _apply(writer: Any, h: dict[str, Any], payload: bytes) -> None:
    if h["t"] == "c":
        conn = _Conn()
        conn.id, conn.client, conn.upstream_addr, conn.opened = \
            h["conn"], h["client"], h["upstream"], h["ts"]
        writer._conn_line(conn, h["event"], h["ts"])
        return
    flow = Flow(h["flow"], h["conn"], h["client"], h["upstream"], h["api_key"],
                h["api_version"], h["corr"], "", b"", h["ts"])
    flow.flags = set(h["flags"])
    fl = h["fl"]
    frame = payload[:fl] if fl < len(payload) else payload
    sent = payload[fl:] if fl < len(payload) else None
    writer.write_frame(flow, h["dir"], frame, sent, h["ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="(internal) kinspect's capture child process")
    ap.add_argument("config", help="JSON configuration")
    args = ap.parse_args(argv)
    return _child(json.loads(args.config))


if __name__ == "__main__":
    raise SystemExit(main())
