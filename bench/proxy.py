"""Proxy benchmark: the broker directly vs. a plain forwarder vs. kinspect.

One run measures, side by side and interleaved over several rounds, the same real
workload (confluent-kafka, acks=1, linger.ms=5) in each mode:

``direct``
    the client talks to the Tansu broker.
``forwarder``
    through ``bench/forwarder.py`` (plain asyncio + uvloop byte forwarding: the
    floor any Python proxy pays). Tansu then advertises the forwarder's address.
``kinspect``
    through kinspect with decoding on and the live view off, no capture.
``kinspect-full``
    through kinspect with decoding, capture (``kinspect.capture_process.CaptureProcess``,
    to a temporary file) and the live view (``kinspect.tui.LiveView`` rendering
    at its normal refresh rate to a rich Console writing to /dev/null).
``kinspect-nodecode``, ``kinspect-norewrite`` (only when asked for with ``--modes``)
    kinspect forwarding and pairing only (``--no-decode``); kinspect without
    address rewriting (Tansu then advertises the proxy's address, as for the
    forwarder), which shows what holding responses for the rewrite check costs.
``kinspect-capture``, ``kinspect-view`` (only with ``--modes``)
    kinspect-full with only one of its two extras: capture without the live view,
    the live view without capture; they split kinspect-full's cost between them.
``tansu-proxy``, ``haproxy`` (peers, only with ``--modes``)
    other proxies on the same path: ``tansu proxy``, the Kafka proxy (Rust) shipped
    in the Tansu binary the broker comes from (it advertises its own address in
    Metadata); HAProxy in TCP mode, one thread (C; byte forwarding like
    ``forwarder``, so Tansu advertises its address; needs the ``haproxy`` binary,
    e.g. ``apt-get install haproxy``: the run stops with a message without it).

Every measurement uses a fresh broker, a fresh proxy process and a fresh client
process: broker, proxy and clients are separate processes. The workload, per
measurement:

1. produce ``--small`` messages of 100 bytes, then ``--large`` of 10 KiB, timed
   from the first ``produce()`` to the end of ``flush()`` (after a warm-up
   message, so connections and metadata are in place);
2. consume each topic back with a consumer assigned to the partition from the
   beginning, timed from ``assign()`` to the last message;
3. a latency loop: ``--latency`` times produce one 100-byte message and
   ``flush()``; p50/p99 of these round trips.

Then the latency loop interleaved message by message, ``--interleaved-runs`` times:
every mode set up at once (each with its own fresh broker), one producer per mode,
and ``--interleaved`` turns, each one produce-and-flush through every mode in a
random order (a fresh permutation each turn, seeded by the run's number), so that
every mode's round trips meet the same machine state; the difference to the
forwarder is taken turn by turn. Each run starts every process afresh: runs of the
same code differ by tens of microseconds (most likely where the scheduler places a
run's processes), which no interleaving within a run cancels, so the report gives
the median over runs and their range.

Then 10 KiB produce interleaved burst by burst, ``--burst-runs`` times: every mode
set up at once again, one producer per mode, and ``--bursts`` turns after one of
warm-up, each producing one burst of ``--burst`` messages through every mode in
turn (one mode busy at a time, in a random order as above), so that each mode's
bursts meet the machine state its neighbours met a fraction of a second before;
each mode's throughput is divided by direct's turn by turn, and the CPU the whole
machine was busy for during each burst (``/proc/stat``) is reported per MB, as is
each proxy's own (its process's threads during the burst, and its capture child's
until the mode's next burst: ``schedstat``, see :func:`_interleaved_throughput`). The
rounds above pair modes half a minute apart, which on a shared virtual machine
moves a round's ratio by tens of percent; this pairing moves a run's ratio by a
few.

Then, once per proxy mode, memory: RSS of the proxy process before and after
opening ``--idle`` idle connections (each sends one ApiVersions request and
waits), and before/during ``--busy`` busy connections (each sends 10 KiB Produce
requests one after the other, built with kinspect.codec). Both on fresh processes.

With ``--baseline DIR`` (a checkout of kinspect, its C extensions built in place:
``python setup.py build_ext --inplace`` there), every kinspect mode in ``--modes``
gets a twin, ``<mode>@baseline``, whose proxy process imports kinspect from that
checkout: ``bench/proxy.py serve`` of this checkout with ``DIR`` where it would put
this checkout on ``sys.path`` (``KINSPECT_BENCH_CHECKOUT``), ``DIR`` first on
``PYTHONPATH`` for the capture's child process, and every proxy process in the
run's temporary directory (a child started with ``python -m`` puts its working
directory first). The twins are measured in the same runs, turn by turn, as any
other mode: a change measured side by side with the code before it. Every kinspect
proxy process says what it imported as it starts (the package and its C
extensions), and the run stops if a twin's are not ``DIR``'s, or another mode's not
this checkout's, or an extension in use is older than its source (rebuild it); a
check before the run also stops it if ``DIR`` lacks a C extension this checkout
uses (unless ``DIR`` predates its source). Each run sets the modes up in an order
rotated by one from the run before, with each twin first on odd runs and its mode
first on even runs. The report adds, run by run, each mode's difference from its
twin. Two checkouts of the same code measure the noise of such a comparison. (The
serving code is this checkout's, so a baseline must have the kinspect API it
calls.)

Results: medians over rounds, as markdown (stdout; ``--update BENCHMARKS.md``
replaces the generated block of its Proxy section) and raw JSON (``--json``).

Usage::

    python bench/proxy.py --rounds 5
    python bench/proxy.py --rounds 1 --small 5000 --large 500 --latency 200   # quick look
    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && python setup.py build_ext --inplace)
    python bench/proxy.py --rounds 0 --modes direct forwarder kinspect-full \
        --baseline /tmp/before                               # this change vs the one before

Diagnostics, from the environment: ``KINSPECT_BENCH_PROFILE=PATH`` writes a cProfile
of each proxy process to ``PATH.<mode>``; ``KINSPECT_BENCH_BACKLOG=1`` samples the
capture's backlog every 5 ms and reports its largest value (``capture_backlog_max``
in the proxy's stats, bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the checkout whose kinspect this process imports: this one, or in the proxy
#: process of a ``--baseline`` twin the baseline checkout (set by ``_proxy_env``)
CHECKOUT = Path(os.environ.get("KINSPECT_BENCH_CHECKOUT") or ROOT)
sys.path.insert(0, str(CHECKOUT))

MODES = ("direct", "forwarder", "kinspect", "kinspect-full")
KINSPECT_MODES = ("kinspect", "kinspect-full", "kinspect-nodecode", "kinspect-norewrite",
                  "kinspect-capture", "kinspect-view")
#: other proxies, measured on the same path (``--modes``)
PEERS = ("tansu-proxy", "haproxy")
ALL_MODES = MODES + KINSPECT_MODES[2:] + PEERS
#: modes whose latency is compared with the forwarder's
COMPARED = KINSPECT_MODES + PEERS
#: suffix of a kinspect mode run from the ``--baseline`` checkout
TWIN = "@baseline"
SMALL, LARGE = 100, 10 * 1024
BLOCK_START = "<!-- bench/proxy.py results: start -->"
BLOCK_END = "<!-- bench/proxy.py results: end -->"


# ---------------------------------------------------------------------------
# process helpers
# ---------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (from /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and of its live child processes (the
    capture process of kinspect-full) so far, seconds."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def task_cpu_s(pids: list[int]) -> float:
    """CPU seconds the live threads of ``pids`` have run so far (the sum of
    ``/proc/<pid>/task/<tid>/schedstat``, nanoseconds: fine enough for a burst of a
    tenth of a second, where ``/proc/<pid>/stat`` counts 10 ms ticks); 0 for a
    process that has exited."""
    total = 0
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/schedstat") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):  # exited meanwhile
                continue
    return total / 1e9


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peer_command(mode: str, upstream: str, listen_port: int, workdir: Path) -> list[str]:
    """The command line of a peer proxy (:data:`PEERS`) listening on ``listen_port``."""
    if mode == "tansu-proxy":
        from kinspect.brokers import TansuBroker

        url = f"tcp://127.0.0.1:{listen_port}"
        return [str(TansuBroker.binary()), "proxy", "--listener-url", url,
                "--advertised-listener-url", url, "--origin-url", f"tcp://{upstream}"]
    exe = shutil.which("haproxy")
    if exe is None:
        raise RuntimeError("the haproxy mode needs the haproxy binary on PATH "
                           "(Debian: apt-get install haproxy)")
    cfg = workdir / f"haproxy-{listen_port}.cfg"
    cfg.write_text("global\n  nbthread 1\n  maxconn 4096\n"
                   "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n"
                   "  timeout server 1h\n"
                   f"listen kafka\n  bind 127.0.0.1:{listen_port}\n"
                   f"  server broker {upstream}\n")
    return [exe, "-db", "-f", str(cfg)]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> bool:
    """Whether ``127.0.0.1:port`` accepts a connection within ``timeout`` seconds
    (``False`` at once when ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def base_mode(mode: str) -> str:
    """The mode a ``--baseline`` twin (``kinspect@baseline``) measures; any other mode
    itself."""
    return mode[:-len(TWIN)] if mode.endswith(TWIN) else mode


def with_twins(modes: list[str]) -> list[str]:
    """``modes`` with each kinspect mode followed by its ``--baseline`` twin."""
    out = []
    for m in modes:
        out.append(m)
        if m in KINSPECT_MODES:
            out.append(m + TWIN)
    return out


def run_order(modes: list[str], run: int) -> list[str]:
    """The order in which run ``run`` (a round, or an interleaved run) sets the modes
    up: ``modes`` rotated by ``run``, then each ``--baseline`` twin and the mode it
    measures in each other's places if need be, so that on odd runs the twin comes
    first and on even runs the mode: neither of the two always comes second."""
    k = run % len(modes) if modes else 0
    order = modes[k:] + modes[:k]
    for t, m in enumerate(order):
        if m.endswith(TWIN) and base_mode(m) in order:
            i = order.index(base_mode(m))
            if (t < i) != bool(run % 2):
                order[i], order[t] = order[t], order[i]
    return order


#: the C extensions whose use ``imported`` reports: (name, source file)
EXTENSIONS = (("decoder (kinspect.codec._native)", "kinspect/codec/_native.c"),
              ("frame buffer (kinspect.proxy._frames)", "kinspect/proxy/_frames.c"))


def imported() -> list[str]:
    """What this process imports of kinspect: the file of the package, then of each
    C extension of :data:`EXTENSIONS` in use (``"-"``: not in use, e.g. not built,
    or built from another version of the decoder's source)."""
    import kinspect
    import kinspect.proxy.server as server
    from kinspect.codec.native import native_module

    native = native_module()
    frames = getattr(server, "_FrameBuffer", None)  # (older versions have none)
    return [kinspect.__file__, native.__file__ if native is not None else "-",
            sys.modules[frames.__module__].__file__ if frames is not None else "-"]


def imported_from(files: list[str], checkout: Path) -> str | None:
    """Why ``files`` (:func:`imported`) are not all ``checkout``'s, or ``None``."""
    if Path(files[0]).resolve() != checkout / "kinspect" / "__init__.py":
        return f"kinspect imported from {files[0]}, not from {checkout}"
    for (name, source), f in zip(EXTENSIONS, files[1:]):
        if f == "-":
            continue
        src = checkout / source
        if Path(f).resolve().parent != src.parent:
            return f"the C {name} loaded from {f}, not from {src.parent}"
        # (a build copied in place keeps whole seconds of its time: a second's slack)
        if src.exists() and src.stat().st_mtime > Path(f).stat().st_mtime + 1:
            return (f"the C {name} in {checkout} is older than its source: rebuild it "
                    f"(`python setup.py build_ext --inplace` there)")
    return None


def check_baseline(path: Path) -> None:
    """Make sure that a proxy process started the way :class:`ProxyProcess` starts a
    ``--baseline`` twin imports kinspect from ``path``, with each C extension this
    checkout's proxies use built from ``path``'s sources (unless ``path`` predates
    one), and that one started as this checkout's imports this checkout. Raises
    ``SystemExit`` with the reason otherwise: a twin that ran this checkout, or
    Python where this checkout runs C, would measure nothing. (Every proxy process
    says what it imported as it starts, and :class:`ProxyProcess` checks that too.)"""
    found = []
    for checkout in (ROOT, path):
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "imported"],
                           capture_output=True, text=True, env=_proxy_env(checkout),
                           cwd=tempfile.gettempdir())
        try:
            found.append(json.loads(p.stdout))
        except ValueError:
            raise SystemExit(f"--baseline {path}: cannot import kinspect from {checkout}:"
                             f"\n{p.stderr[-2000:]}") from None
    here, there = found
    problem = imported_from(here, ROOT)
    if problem is not None:
        raise SystemExit(f"--baseline {path}: this checkout: {problem}")
    problem = imported_from(there, path)
    if problem is None:
        for (name, source), mine, theirs in zip(EXTENSIONS, here[1:], there[1:]):
            # (a checkout from before an extension existed runs without it)
            if mine != "-" and theirs == "-" and (path / source).exists():
                problem = (f"its C {name} is not in use (not built, or built from "
                           f"another version): `python setup.py build_ext --inplace` there")
                break
    if problem is not None:
        raise SystemExit(f"--baseline {path}: {problem}")


def _proxy_env(checkout: Path) -> dict[str, str]:
    """The environment of a kinspect proxy process: this one's, with ``checkout``
    (this one, or a twin's ``--baseline``) as the checkout ``bench/proxy.py`` imports
    kinspect from (``KINSPECT_BENCH_CHECKOUT``) and first on ``PYTHONPATH``, for the
    capture's child process (``python -m kinspect.capture_process``, which also puts
    its working directory first: proxies run in the bench's temporary one)."""
    env = dict(os.environ)
    env["KINSPECT_BENCH_CHECKOUT"] = str(checkout)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(checkout)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


#: the ``--baseline`` checkout, once checked (``run_bench``)
BASELINE: Path | None = None


#: set-ups of a mode tried before a taken port (:class:`PortTaken`) stops the run
SETUP_TRIES = 3


class PortTaken(RuntimeError):
    """A proxy could not listen: its port, free when :func:`free_port` chose it, was
    taken before the proxy bound it (by another process's connection: the port came
    from the ephemeral range that outgoing connections use too)."""


def _failed_to_start(mode: str, what: str, err_path: Path) -> RuntimeError:
    """The error for a proxy that did not start (:class:`PortTaken` when its error
    output says its address was in use), with the end of that output."""
    text = err_path.read_text(errors="replace")[-3000:]
    taken = any(s in text.lower() for s in ("address already in use", "errno 98",
                                            "eaddrinuse", "cannot bind socket"))
    return (PortTaken if taken else RuntimeError)(f"{mode} {what}:\n{text}")


class ProxyProcess:
    """A proxy (forwarder, kinspect or a peer) in its own process; ``None`` mode =
    direct."""

    def __init__(self, mode: str, upstream: str, listen_port: int, workdir: Path):
        self.mode = mode
        self.stats: dict[str, Any] = {}
        self.err_path = workdir / f"{mode}.stderr"
        if mode in PEERS:
            self.proc = subprocess.Popen(_peer_command(mode, upstream, listen_port, workdir),
                                         stdout=subprocess.DEVNULL,
                                         stderr=open(self.err_path, "wb"),
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            if not _wait_listening(listen_port, self.proc):
                self.stop()
                raise _failed_to_start(mode, f"did not start listening on port {listen_port}",
                                       self.err_path)
            self.address = f"127.0.0.1:{listen_port}"
            return
        if mode == "forwarder":
            cmd = [sys.executable, str(HERE / "forwarder.py"), "--upstream", upstream,
                   "--listen", f"127.0.0.1:{listen_port}"]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "serve",
                   "--mode", base_mode(mode),
                   "--upstream", upstream, "--listen", f"127.0.0.1:{listen_port}",
                   "--capture", str(workdir / f"bench-{mode}.jsonl")]
            if os.environ.get("KINSPECT_BENCH_PROFILE"):
                cmd += ["--profile", str(Path(os.environ["KINSPECT_BENCH_PROFILE"]).resolve())
                        + f".{mode}"]
        twin = mode.endswith(TWIN)
        if twin and BASELINE is None:
            raise RuntimeError(f"{mode}: no --baseline checkout to run it from")
        checkout = BASELINE if twin else ROOT
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.err_path, "wb"),
                                     stdin=subprocess.DEVNULL, start_new_session=True, text=True,
                                     cwd=workdir,
                                     env=None if mode == "forwarder" else _proxy_env(checkout))
        line = self.proc.stdout.readline()
        if mode != "forwarder" and line:
            # kinspect says first what it imported: this checkout's, or a twin's DIR's
            try:
                problem = (imported_from(json.loads(line[len("imported "):]), checkout)
                           if line.startswith("imported ") else f"said {line!r} first")
            except (ValueError, OSError) as e:
                problem = f"cannot check what it imported ({line!r}): {e}"
            if problem is not None:
                self.stop()
                raise RuntimeError(f"{mode}: {problem}")
            line = self.proc.stdout.readline()
        if not line.startswith("listening on"):
            self.stop()
            raise _failed_to_start(mode, f"proxy did not start: {line!r}", self.err_path)
        self.address = line.split()[-1]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        for line in (out or "").splitlines() if isinstance(out, str) else ():
            if line.startswith("{"):
                self.stats = json.loads(line)


class Setup:
    """A fresh broker (+ proxy) for one measurement. A proxy whose port was taken
    before it could listen (:class:`PortTaken`) is set up again, broker and all (the
    broker may advertise the proxy's port), up to :data:`SETUP_TRIES` times."""

    def __init__(self, mode: str, workdir: Path):
        self.mode = mode
        for attempt in range(1, SETUP_TRIES + 1):
            try:
                self._start(workdir)
                return
            except PortTaken:
                if attempt == SETUP_TRIES:
                    raise
                print(f"{mode}: its port was taken before it listened; setting it up again",
                      file=sys.stderr)

    def _start(self, workdir: Path) -> None:
        from kinspect.brokers import TansuBroker

        mode = self.mode
        self.proxy: ProxyProcess | None = None
        listen_port = free_port()
        advertised = (f"127.0.0.1:{listen_port}"
                      if base_mode(mode) in ("forwarder", "kinspect-norewrite", "haproxy")
                      else None)
        self.broker = TansuBroker(advertised=advertised).start()
        try:
            if mode != "direct":
                self.proxy = ProxyProcess(mode, self.broker.bootstrap, listen_port, workdir)
        except BaseException:
            self.broker.stop()
            raise
        self.bootstrap = self.proxy.address if self.proxy else self.broker.bootstrap

    def stop(self) -> None:
        try:
            if self.proxy is not None:
                self.proxy.stop()
        finally:
            self.broker.stop()


# ---------------------------------------------------------------------------
# the proxy process (kinspect modes)
# ---------------------------------------------------------------------------

def serve(args: argparse.Namespace) -> int:
    """Run kinspect in this process until SIGTERM: say what it imported
    (:func:`imported`), then ``listening on HOST:PORT``; print stats as JSON on exit."""
    print("imported " + json.dumps(imported()), flush=True)
    from kinspect.codec import Codec
    from kinspect.proxy.pipeline import Pipeline
    from kinspect.proxy.server import Proxy, ProxyConfig, install_uvloop, parse_hostport

    install_uvloop()
    full = args.mode == "kinspect-full"
    with_capture = full or args.mode == "kinspect-capture"
    with_view = full or args.mode == "kinspect-view"
    info: dict[str, Any] = {"capture": None}

    async def main() -> None:
        codec = Codec()
        pipeline = Pipeline(codec, decode=args.mode != "kinspect-nodecode")
        proxy = Proxy(ProxyConfig(upstream=parse_hostport(args.upstream),
                                  listen=parse_hostport(args.listen),
                                  rewrite=args.mode != "kinspect-norewrite"), codec, pipeline)
        view = capture = None
        if with_capture:
            from kinspect.capture_process import CaptureProcess

            # what `kinspect proxy --capture` uses
            capture = CaptureProcess(args.capture, codec, upstream=args.upstream,
                                     listen=args.listen)
            info["capture"] = "kinspect.capture_process.CaptureProcess"
            pipeline.add(capture)
        if with_view:
            from rich.console import Console

            from kinspect.tui import LiveView

            console = Console(file=open(os.devnull, "w"), force_terminal=True, width=200,
                              height=50, color_system="truecolor")
            view = LiveView(proxy, console=console, title="kinspect bench")
            pipeline.add(view)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await proxy.start()
        if view is not None:
            view.start()
        if capture is not None and os.environ.get("KINSPECT_BENCH_BACKLOG"):
            # diagnostics: the capture's largest backlog, sampled every 5 ms (the
            # pipeline pauses the proxy past capture.pause_bytes)
            info["capture_backlog_max"] = 0

            def sample() -> None:
                info["capture_backlog_max"] = max(info["capture_backlog_max"],
                                                  capture.backlog_bytes)
                loop.call_later(0.005, sample)

            sample()
        print("listening on %s:%d" % proxy.address, flush=True)
        await stop.wait()
        await proxy.close()
        s = proxy.stats
        info.update(flows=s.flows, decode_skipped=s.decode_skipped, undecoded=s.undecoded,
                    connections=s.connections_total, rewritten=s.rewritten,
                    overloads=getattr(s, "overloads", 0))
        if capture is not None:
            info["capture_frames"] = capture.frames
            info["capture_ring_frames"] = capture.ring_frames

    if args.profile:  # diagnostics: cProfile of the proxy process
        import cProfile

        cProfile.runctx("asyncio.run(main())", globals(), {"asyncio": asyncio, "main": main},
                        args.profile)
    else:
        asyncio.run(main())
    print(json.dumps(info), flush=True)
    return 0


# ---------------------------------------------------------------------------
# the client process (confluent-kafka)
# ---------------------------------------------------------------------------

def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot, all cores (from
    /proc/stat: user, nice, system, irq and softirq; not idle, iowait or steal, the
    time a virtual machine waited for its host), or ``None`` without /proc. In a
    container, /proc/stat is the host's. Counted in clock ticks (10 ms at 100 Hz)."""
    try:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4] - v[7]) / os.sysconf("SC_CLK_TCK")


def client(args: argparse.Namespace) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    common = {"bootstrap.servers": args.bootstrap, "client.id": "kinspect-bench"}
    tag = args.topic_suffix or os.urandom(4).hex()
    topics = {"small": f"bench-small-{tag}", "large": f"bench-large-{tag}",
              "lat": f"bench-latency-{tag}"}
    admin = AdminClient(common)
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()]).values():
        fut.result(timeout=20)
    result: dict[str, Any] = {}
    producer = Producer({**common, "acks": 1, "linger.ms": 5})
    failed: list[Any] = []
    delivered = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered[0] += 1

    producer.produce(topics["lat"], b"warm-up", on_delivery=on_delivery)
    if producer.flush(20):
        raise RuntimeError("warm-up message not delivered")
    rnd = os.urandom(LARGE)
    counts = {"small": (SMALL, args.small), "large": (LARGE, args.large)}
    for name, (size, n) in counts.items():
        value = rnd[:size]
        delivered[0] = 0
        busy0 = _machine_busy_s()
        t0 = time.perf_counter()
        for _ in range(n):
            while True:
                try:
                    producer.produce(topics[name], value, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.001)
        left = producer.flush(120)
        t1 = time.perf_counter()
        if left or failed or delivered[0] != n:
            raise RuntimeError(f"produce {name}: {delivered[0]}/{n} delivered, {failed[:3]}")
        result[f"produce_{name}"] = {"msgs": n, "bytes": n * size, "seconds": t1 - t0}
        busy1 = _machine_busy_s()
        if busy0 is not None and busy1 is not None:
            # every process on the machine: client, broker, proxy, capture child
            result[f"produce_{name}"]["cores_busy"] = (busy1 - busy0) / (t1 - t0)

    # fetch.wait.max.ms=10: the long poll left on the previous topic ends quickly
    consumer = Consumer({**common, "group.id": "bench", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
    # connect first (bootstrap, metadata, first fetch) on the latency topic
    consumer.assign([TopicPartition(topics["lat"], 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + 60
    while not [m for m in consumer.consume(num_messages=10, timeout=0.5) if m.error() is None]:
        if time.monotonic() > deadline:
            raise RuntimeError("consumer got nothing from the warm-up topic in 60 s")
    for name, (size, n) in counts.items():
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topics[name], 0, OFFSET_BEGINNING)])
        got = 0
        deadline = time.monotonic() + 120
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consume {name}: {got}/{n} in 120 s")
            for m in consumer.consume(num_messages=min(1000, n - got), timeout=0.2):
                if m.error() is None:
                    got += 1
        t1 = time.perf_counter()
        result[f"consume_{name}"] = {"msgs": got, "bytes": got * size, "seconds": t1 - t0}
    consumer.close()

    value = rnd[:SMALL]
    lat = []
    for i in range(args.warmup + args.latency):
        t0 = time.perf_counter_ns()
        producer.produce(topics["lat"], value, on_delivery=on_delivery)
        if producer.flush(10):
            raise RuntimeError("latency message not delivered")
        if i >= args.warmup:
            lat.append(time.perf_counter_ns() - t0)
    if failed:
        raise RuntimeError(f"delivery failures: {failed[:3]}")
    lat.sort()
    result["latency_us"] = {"p50": lat[len(lat) // 2] / 1000,
                            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000,
                            "n": len(lat)}
    print(json.dumps(result), flush=True)
    return 0


def run_client(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "client", "--bootstrap", bootstrap,
           "--small", str(args.small), "--large", str(args.large), "--latency",
           str(args.latency), "--warmup", str(args.warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"client failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# memory per connection (raw sockets, requests built with kinspect.codec)
# ---------------------------------------------------------------------------

def _raw_request(codec: Any, api_key: int, version: int, corr: int, body: dict) -> bytes:
    from kinspect.codec.frames import frame
    from kinspect.codec.protocol import Request

    value = codec.request_codec(api_key).cls.from_dict(body)
    hv = codec.request_header_version(api_key, version)
    return frame(codec.encode_request(Request(api_key, version, corr, "bench-raw", hv, None,
                                              value, 0, codec.api_name(api_key))))


def _produce_body(topic: str, size: int) -> dict:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, size + 1024)
    b.append(0, int(time.time() * 1000), None, os.urandom(size), [])
    return {"TransactionalId": None, "Acks": 1, "TimeoutMs": 10000,
            "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0,
                                                              "Records": bytes(b.build())}]}]}


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
    return await reader.readexactly(size)


async def _idle_conns(host: str, port: int, n: int, codec: Any) -> list:
    req = _raw_request(codec, 18, 3, 1, {"ClientSoftwareName": "bench",
                                         "ClientSoftwareVersion": "1"})
    conns = []
    for _ in range(n):
        r, w = await asyncio.open_connection(host, port)
        w.write(req)
        conns.append((r, w))
    for r, _ in conns:
        await _read_frame(r)
    return conns


def _measure_memory(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from kinspect.codec import Codec

    codec = Codec()
    out: dict[str, Any] = {}

    # idle connections
    s = Setup(mode, workdir)
    try:
        host, port = s.bootstrap.rsplit(":", 1)

        async def idle() -> tuple[int, int]:
            warm = await _idle_conns(host, int(port), 5, codec)
            for _, w in warm:
                w.close()
            await asyncio.sleep(0.5)
            r0 = rss_kib(s.proxy.pid)
            conns = await _idle_conns(host, int(port), args.idle, codec)
            await asyncio.sleep(1.0)
            r1 = rss_kib(s.proxy.pid)
            for _, w in conns:
                w.close()
            return r0, r1

        r0, r1 = asyncio.run(idle())
        out["rss_base_kib"] = r0
        out["idle_kib_per_conn"] = (r1 - r0) / args.idle
    finally:
        s.stop()

    # busy connections
    s = Setup(mode, workdir)
    try:
        host, port = s.bootstrap.rsplit(":", 1)
        admin = AdminClient({"bootstrap.servers": s.broker.bootstrap})
        for fut in admin.create_topics([NewTopic("bench-busy", 1, 1)]).values():
            fut.result(timeout=20)
        body = _produce_body("bench-busy", LARGE)

        async def busy() -> tuple[int, int, int]:
            warm = await _idle_conns(host, int(port), 5, codec)
            for _, w in warm:
                w.close()
            await asyncio.sleep(0.5)
            r0 = rss_kib(s.proxy.pid)
            stop = asyncio.Event()
            sent = [0]

            async def one(i: int) -> None:
                r, w = await asyncio.open_connection(host, int(port))
                corr = 0
                while not stop.is_set():
                    corr += 1
                    w.write(_raw_request(codec, 0, 9, corr, body))
                    resp = await _read_frame(r)
                    if int.from_bytes(resp[:4], "big", signed=True) != corr:
                        raise RuntimeError("correlation id mismatch")
                    sent[0] += 1
                w.close()

            tasks = [asyncio.create_task(one(i)) for i in range(args.busy)]
            peak = r0
            t_end = time.monotonic() + args.busy_seconds
            while time.monotonic() < t_end:
                await asyncio.sleep(0.1)
                peak = max(peak, rss_kib(s.proxy.pid))
            stop.set()
            await asyncio.gather(*tasks)
            return r0, peak, sent[0]

        r0, peak, sent = asyncio.run(busy())
        out["busy_kib_per_conn"] = (peak - r0) / args.busy
        out["busy_requests"] = sent
    finally:
        s.stop()
    return out


# ---------------------------------------------------------------------------
# the latency loop, interleaved message by message
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def _every_mode_at_once(modes: list[str], topic: str, workdir: Path,
                        pids: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Every mode set up at once (each with its own fresh broker, as in the rounds),
    ``topic`` created (one partition) and one confluent-kafka producer per mode
    (``acks=1``, ``linger.ms=5``): yields ``{mode: producer}`` in the order given,
    and stops every broker and proxy on the way out. ``pids``, when given, gets each
    proxy mode's process id."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    setups: dict[str, Setup] = {}
    producers: dict[str, Any] = {}
    try:
        for m in modes:
            setups[m] = Setup(m, workdir)
            if pids is not None and setups[m].proxy is not None:
                pids[m] = setups[m].proxy.pid
        for m, s in setups.items():
            common = {"bootstrap.servers": s.bootstrap, "client.id": "kinspect-bench"}
            admin = AdminClient(common)
            for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                fut.result(timeout=20)
            producers[m] = Producer({**common, "acks": 1, "linger.ms": 5})
        yield producers
    finally:
        producers.clear()
        failed = None
        for s in setups.values():  # every one, whatever happens to the others
            try:
                s.stop()
            except Exception as e:  # noqa: BLE001 - said once all are stopped
                failed = failed or e
        if failed is not None and sys.exc_info()[1] is None:
            raise failed


def _turns(names: list[str], n: int, seed: int) -> Iterator[list[str]]:
    """``n`` orders of ``names``, one per turn, each a fresh random permutation
    (``random.Random(seed)``): no mode always follows the same one, so that what a
    mode leaves running after its turn (a capture child still writing, say) lands on
    every other mode in turn rather than always on one neighbour."""
    rng = random.Random(seed)
    for _ in range(n):
        order = list(names)
        rng.shuffle(order)
        yield order


def _interleaved_latency(modes: list[str], n: int, warmup: int, workdir: Path,
                         seed: int = 0) -> dict[str, dict[str, float]]:
    """The latency loop (produce one 100-byte message, ``flush()``) interleaved
    message by message: every mode is set up at once (each with its own fresh
    broker, as in the rounds), one confluent-kafka producer per mode, and each turn
    runs one round trip through every mode, in a random order each turn (see
    :func:`_turns`; ``seed``).
    Returns, per mode, p50/p99 in µs and (for kinspect modes and the peers) the
    median over turns of its round trip minus the forwarder's in the same turn."""
    with _every_mode_at_once(modes, "bench-interleaved", workdir) as producers:
        value = os.urandom(SMALL)
        names = list(producers)
        times: dict[str, list[float]] = {m: [] for m in names}
        for i, order in enumerate(_turns(names, warmup + n, seed)):
            for m in order:
                p = producers[m]
                t0 = time.perf_counter_ns()
                p.produce("bench-interleaved", value)
                if p.flush(10):
                    raise RuntimeError(f"{m}: latency message not delivered")
                if i >= warmup:
                    times[m].append((time.perf_counter_ns() - t0) / 1000)
    out: dict[str, dict[str, float]] = {}
    fwd = times.get("forwarder")
    for m, v in times.items():
        srt = sorted(v)
        out[m] = {"p50": statistics.median(v), "p99": srt[min(len(v) - 1, int(len(v) * 0.99))],
                  "n": len(v)}
        if fwd is not None and base_mode(m) in COMPARED:
            out[m]["d_vs_fwd"] = statistics.median(a - b for a, b in zip(v, fwd))
    return out


def _interleaved_throughput(modes: list[str], turns: int, burst: int, workdir: Path,
                            seed: int = 0) -> dict[str, dict[str, float]]:
    """10 KiB produce interleaved burst by burst: every mode is set up at once (each
    with its own fresh broker), one confluent-kafka producer per mode, and each turn
    produces ``burst`` 10 KiB messages through every mode in turn (timed from the
    first ``produce()`` to the end of ``flush()``), in a random order each turn (see
    :func:`_turns`; ``seed``), after one turn of warm-up. Only one mode is busy at a
    time, and a mode's bursts meet the same machine state as its neighbours' a
    fraction of a second apart. Returns, per mode: MB/s of the median burst, the machine's busy CPU
    seconds per burst (median; from /proc/stat, every process), and for every mode
    but direct the median over turns of its throughput divided by direct's in the
    same turn. For each proxy, its own CPU seconds per burst (median): the proxy
    process's threads from the first ``produce()`` to the end of ``flush()``
    (``proxy_cpu_s``; what its pipeline does after that for the burst's last flows is
    not counted), and its child processes' (kinspect-full's capture) from the start
    of the burst to the start of the mode's next one, or to half a second after the
    last turn (``child_cpu_s``: the child goes on writing lines after the burst)."""
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    pids: dict[str, int] = {}
    with _every_mode_at_once(modes, "bench-bursts", workdir, pids) as producers:
        value = os.urandom(LARGE)
        names = list(producers)
        seconds: dict[str, list[float]] = {m: [] for m in names}
        busy: dict[str, list[float]] = {m: [] for m in names}
        own: dict[str, list[float]] = {m: [] for m in pids}
        kids: dict[str, list[float]] = {m: [] for m in pids}
        kids_from: dict[str, float] = {}  # a child's CPU at the start of its last burst

        def kids_cpu(m: str) -> float:
            return task_cpu_s(_children(pids[m]))

        for i, order in enumerate(_turns(names, turns + 1, seed)):  # (turn 0 warms up)
            for m in order:
                p = producers[m]
                if m in pids:
                    k0 = kids_cpu(m)
                    if m in kids_from:  # (the burst before: from the warm-up's on)
                        if i > 1:
                            kids[m].append(k0 - kids_from[m])
                    kids_from[m] = k0
                    own0 = task_cpu_s([pids[m]])
                busy0 = _machine_busy_s()
                t0 = time.perf_counter()
                for _ in range(burst):
                    while True:
                        try:
                            p.produce("bench-bursts", value, on_delivery=on_delivery)
                            break
                        except BufferError:
                            p.poll(0.001)
                left = p.flush(120)
                t1 = time.perf_counter()
                busy1 = _machine_busy_s()
                if m in pids and i:
                    own[m].append(task_cpu_s([pids[m]]) - own0)
                if left or failed:
                    raise RuntimeError(f"{m}: burst not delivered ({left} left, {failed[:3]})")
                if i:
                    seconds[m].append(t1 - t0)
                    if busy0 is not None and busy1 is not None:
                        busy[m].append(busy1 - busy0)
        if turns:
            time.sleep(0.5)  # (the last bursts' capture lines)
            for m, k0 in kids_from.items():
                kids[m].append(kids_cpu(m) - k0)
    out: dict[str, dict[str, float]] = {}
    direct = seconds.get("direct")
    for m, v in seconds.items():
        out[m] = {"mb_s": burst * LARGE / statistics.median(v) / 1e6, "n": len(v)}
        if busy[m]:
            out[m]["machine_cpu_s"] = statistics.median(busy[m])
        if own.get(m):
            out[m]["proxy_cpu_s"] = statistics.median(own[m])
            out[m]["child_cpu_s"] = statistics.median(kids[m])
        if direct is not None and m != "direct":
            # throughput ratio = direct's time / this mode's time, turn by turn
            out[m]["ratio"] = statistics.median(a / b for a, b in zip(direct, v))
    return out


# ---------------------------------------------------------------------------
# orchestration and report
# ---------------------------------------------------------------------------

def _metrics(res: dict[str, Any]) -> dict[str, float]:
    m = {}
    for key in ("produce_small", "produce_large", "consume_small", "consume_large"):
        r = res[key]
        m[f"{key}_msgs"] = r["msgs"] / r["seconds"]
        m[f"{key}_mb"] = r["bytes"] / r["seconds"] / 1e6
    if "cores_busy" in res["produce_large"]:
        m["produce_large_cores"] = res["produce_large"]["cores_busy"]
        m["produce_large_machine_cpu_s"] = (res["produce_large"]["cores_busy"]
                                            * res["produce_large"]["seconds"])
    m["lat_p50"] = res["latency_us"]["p50"]
    m["lat_p99"] = res["latency_us"]["p99"]
    for k in ("proxy_cpu_s",):
        if k in res:
            m[k] = res[k]
    return m


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    global BASELINE
    modes = args.modes
    baseline = None
    if args.baseline is not None:
        modes = args.modes = with_twins(modes)
        if not any(m.endswith(TWIN) for m in modes):
            raise SystemExit("--baseline: no kinspect mode in --modes to run from it")
        check_baseline(args.baseline)
        BASELINE = args.baseline
        baseline = str(args.baseline)
    load_before = os.getloadavg()
    run_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    raw: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    stats: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="kinspect-bench-") as tmp:
        workdir = Path(tmp)
        for rnd in range(args.rounds):
            order = run_order(modes, rnd)  # rotated
            for mode in order:
                s = Setup(mode, workdir)
                try:
                    cpu0 = cpu_seconds(s.proxy.pid) if s.proxy else 0.0
                    res = run_client(s.bootstrap, args)
                    if s.proxy:
                        res["proxy_cpu_s"] = cpu_seconds(s.proxy.pid) - cpu0
                finally:
                    s.stop()
                if s.proxy is not None:
                    stats[mode].append(s.proxy.stats)
                raw[mode].append(res)
                m = _metrics(res)
                print(f"round {rnd + 1}/{args.rounds} {mode:>17}: "
                      f"produce 10KiB {m['produce_large_mb']:.1f} MB/s, "
                      f"100B {m['produce_small_msgs']:.0f} msg/s; consume 10KiB "
                      f"{m['consume_large_mb']:.1f} MB/s; latency p50 {m['lat_p50']:.0f} µs "
                      f"p99 {m['lat_p99']:.0f} µs", file=sys.stderr, flush=True)
        interleaved = []
        for run in range(args.interleaved_runs if args.interleaved else 0):
            order = run_order(modes, run)
            one = _interleaved_latency(order, args.interleaved, args.warmup, workdir, run)
            interleaved.append({m: one[m] for m in modes})
            print(f"interleaved latency, run {run + 1}/{args.interleaved_runs}: {one}",
                  file=sys.stderr, flush=True)
        bursts = []
        for run in range(args.burst_runs if args.bursts else 0):
            order = run_order(modes, run)
            one = _interleaved_throughput(order, args.bursts, args.burst, workdir, run)
            bursts.append({m: one[m] for m in modes})
            print(f"interleaved throughput, run {run + 1}/{args.burst_runs}: {one}",
                  file=sys.stderr, flush=True)
        memory = {}
        if args.idle or args.busy:
            for mode in modes:
                if mode == "direct":
                    continue
                memory[mode] = _measure_memory(mode, args, workdir)
                print(f"memory {mode}: {memory[mode]}", file=sys.stderr, flush=True)
    return {"raw": raw, "proxy_stats": stats, "memory": memory, "interleaved": interleaved,
            "bursts": bursts, "args": vars(args),
            "loadavg": [load_before, os.getloadavg()], "run_at": run_at,
            "cpu_count": os.cpu_count(), "baseline": baseline}


def _median_metrics(runs: list[dict[str, Any]]) -> dict[str, float]:
    ms = [_metrics(r) for r in runs]
    keys = dict.fromkeys(k for m in ms for k in m)  # (a key some rounds lack: the others)
    return {k: statistics.median(m[k] for m in ms if k in m) for k in keys}


def _table(lines: list[str], caption: str, columns: list[str]) -> None:
    """Append a blank line, ``caption``, a blank line and a markdown table's head."""
    lines += ["", caption, "", "| " + " | ".join(columns) + " |",
              "|" + "---|" * len(columns)]


def report(data: dict[str, Any]) -> str:
    args = data["args"]
    modes = [m for m in args["modes"] if data["raw"].get(m)]
    med = {m: _median_metrics(data["raw"][m]) for m in modes}
    base = med.get("direct")
    fwd = med.get("forwarder")

    def ratio(mode: str, key: str) -> str:
        if base is None or not base[key]:
            return ""
        return f" (×{med[mode][key] / base[key]:.2f})"

    lines = []
    ncpu = data.get("cpu_count") or os.cpu_count()
    run_at = data.get("run_at") or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines.append(f"Run: {run_at}, "
                 f"{args['rounds']} rounds (median), {ncpu} cores, "
                 f"Python {platform.python_version()}, "
                 f"produce {args['small']} × 100 B and {args['large']} × 10 KiB, "
                 f"latency loop {args['latency']} (+{args['warmup']} warm-up)."
                 + (" Load average (1 min) before/after: %.1f / %.1f." %
                    (data["loadavg"][0][0], data["loadavg"][1][0]) if data.get("loadavg") else "")
                 + (f" Modes `…{TWIN}`: the same mode run from another checkout "
                    f"(`--baseline`, the checkout `{data['baseline']}`)."
                    if data.get("baseline") else ""))
    if modes:  # (no rounds: no table)
        lines.append("")
        lines.append("| mode | produce 100 B msgs/s | produce 10 KiB MB/s | consume 100 B msgs/s | "
                     "consume 10 KiB MB/s | latency p50 µs (Δ vs forwarder, median of rounds) | "
                     "latency p99 µs | proxy CPU s |")
        lines.append("|---|---|---|---|---|---|---|---|")
    for m in modes:
        r = med[m]
        p50 = f"{r['lat_p50']:.0f}"
        if fwd is not None and base_mode(m) in COMPARED:
            # median of the per-round differences (each round runs every mode)
            diffs = [a["latency_us"]["p50"] - b["latency_us"]["p50"]
                     for a, b in zip(data["raw"][m], data["raw"]["forwarder"])]
            p50 += f" ({statistics.median(diffs):+.0f} vs fwd)"
        cpu = f"{r['proxy_cpu_s']:.2f}" if "proxy_cpu_s" in r else "-"
        lines.append(
            f"| {m} | {r['produce_small_msgs']:,.0f}{ratio(m, 'produce_small_msgs')} "
            f"| {r['produce_large_mb']:.1f}{ratio(m, 'produce_large_mb')} "
            f"| {r['consume_small_msgs']:,.0f}{ratio(m, 'consume_small_msgs')} "
            f"| {r['consume_large_mb']:.1f}{ratio(m, 'consume_large_mb')} "
            f"| {p50} | {r['lat_p99']:.0f} | {cpu} |")
    if base is not None and len(modes) > 1:
        # each round runs every mode back to back: a mode's ratio to direct within a
        # round cancels what drifts between rounds (load, the VM's memory)
        lines.append("")
        lines.append("Paired by round: each mode's ratio to direct in the same round, median "
                     "(lowest–highest) over the rounds. Last column: the CPU the whole machine "
                     "was busy for while producing the 10 KiB messages, in cores (of "
                     f"{ncpu}) and in CPU seconds, medians over the rounds (counted in 10 ms "
                     "ticks: ±0.05 cores).")
        lines.append("")
        lines.append("| mode | produce 100 B | produce 10 KiB | consume 100 B | consume 10 KiB | "
                     "machine busy, 10 KiB produce |")
        lines.append("|---|---|---|---|---|---|")
        for m in modes:
            ms = [_metrics(a) for a in data["raw"][m]]
            cores = [x["produce_large_cores"] for x in ms if "produce_large_cores" in x]
            secs = [x["produce_large_machine_cpu_s"] for x in ms
                    if "produce_large_machine_cpu_s" in x]
            busy = f"{statistics.median(cores):.2f} cores" if cores else "-"
            if secs:
                busy += f" ({statistics.median(secs):.2f} s)"
            if m == "direct":
                lines.append("| direct | ×1.00 | ×1.00 | ×1.00 | ×1.00 | " + busy + " |")
                continue
            cells = []
            for key in ("produce_small_msgs", "produce_large_mb", "consume_small_msgs",
                        "consume_large_mb"):
                rs = [_metrics(a)[key] / _metrics(b)[key]
                      for a, b in zip(data["raw"][m], data["raw"]["direct"]) if _metrics(b)[key]]
                cells.append(f"×{statistics.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})"
                             if rs else "-")
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {busy} |")
    if data.get("interleaved"):
        runs = data["interleaved"]
        if isinstance(runs, dict):  # (one run: JSON written before runs were repeated)
            runs = [runs]
        _table(lines, f"Latency loop interleaved message by message, {len(runs)} run(s): in "
               f"each, every mode set up afresh at once (each with its own broker), "
               f"one producer per mode, each turn one produce-and-flush through every "
               f"mode in a random order, {args['interleaved']} turns "
               f"(+{args['warmup']} warm-up). The difference of a run is the median over "
               f"its turns of the mode's round trip minus the forwarder's in the same "
               f"turn; the table gives "
               f"medians over the runs, and the range of the differences.",
               ["mode", "p50 µs", "p99 µs",
                "Δ vs forwarder, paired by turn µs (lowest–highest run)"])
        for m in runs[0]:
            rs = [r[m] for r in runs if m in r]
            ds = [r["d_vs_fwd"] for r in rs if "d_vs_fwd" in r]
            d = (f"{statistics.median(ds):+.0f} ({min(ds):+.0f} to {max(ds):+.0f})"
                 if ds else "-")
            lines.append(f"| {m} | {statistics.median(r['p50'] for r in rs):.0f} | "
                         f"{statistics.median(r['p99'] for r in rs):.0f} | {d} |")
        _twin_lines(lines, runs, "d_vs_fwd", "Each mode's difference from the forwarder minus "
                    "its twin's, run by run (µs)", "{:+.0f}")
    if data.get("bursts"):
        runs = data["bursts"]
        burst_mb = args["burst"] * LARGE / 1e6
        _table(lines, f"10 KiB produce interleaved burst by burst, {len(runs)} run(s): in each, "
               f"every mode set up afresh at once (each with its own broker), one "
               f"producer per mode, each turn one burst of {args['burst']} messages "
               f"({burst_mb:.1f} MB, first `produce()` to end of `flush()`) through "
               f"every mode in a random order, {args['bursts']} turns (+1 warm-up). The ratio "
               f"of a run is the median over its turns of the mode's throughput over "
               f"direct's in the same turn; the table gives medians over the runs and "
               f"the range of the ratios. Machine CPU: the CPU seconds every process "
               f"on the machine was busy for during a burst (median of the turns, "
               f"10 ms ticks), per MB. Proxy CPU: the proxy process's own, all its "
               f"threads, during a burst; its child's (kinspect's capture process) from "
               f"the start of a burst to the start of the mode's next one (it writes "
               f"its lines after the burst); medians over the turns, then over the "
               f"runs, per MB (nanoseconds, from /proc/PID/task/TID/schedstat).",
               ["mode", "MB/s", "×direct, paired by turn (lowest–highest run)",
                "machine CPU ms per MB", "proxy CPU ms per MB (+ child)"])
        for m in runs[0]:
            rs = [r[m] for r in runs if m in r]
            ratios = [r["ratio"] for r in rs if "ratio" in r]
            ratio = (f"×{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                     if ratios else "×1.00" if m == "direct" else "-")
            cpus = [r["machine_cpu_s"] for r in rs if "machine_cpu_s" in r]
            cpu = f"{statistics.median(cpus) / burst_mb * 1000:.2f}" if cpus else "-"
            owns = [r["proxy_cpu_s"] for r in rs if "proxy_cpu_s" in r]
            kid = [r["child_cpu_s"] for r in rs if "child_cpu_s" in r]
            proxy = "-"
            if owns:
                proxy = f"{statistics.median(owns) / burst_mb * 1000:.2f}"
                k = statistics.median(kid) / burst_mb * 1000 if kid else 0.0
                if k >= 0.005:
                    proxy += f" (+ {k:.2f})"
            lines.append(f"| {m} | {statistics.median(r['mb_s'] for r in rs):.1f} | {ratio} | "
                         f"{cpu} | {proxy} |")
        _twin_lines(lines, runs, "ratio", "Each mode's ratio to direct minus its twin's, run "
                    "by run", "{:+.3f}")
    if data.get("memory"):
        lines.append("")
        lines.append(f"| mode | RSS at start MiB | KiB per idle connection ({args['idle']}) | "
                     f"KiB per busy connection ({args['busy']}, 10 KiB Produce) |")
        lines.append("|---|---|---|---|")
        for m, r in data["memory"].items():
            lines.append(f"| {m} | {r['rss_base_kib'] / 1024:.1f} | "
                         f"{r['idle_kib_per_conn']:.1f} | {r['busy_kib_per_conn']:.1f} |")
    notes = []
    for m, sl in data.get("proxy_stats", {}).items():
        if not sl:
            continue
        skipped = sum(s.get("decode_skipped", 0) for s in sl)
        flows = sum(s.get("flows", 0) for s in sl)
        if flows:
            notes.append(f"{m}: {flows:,} flows, {skipped:,} decode-skipped, "
                         f"{sum(s.get('undecoded', 0) for s in sl):,} undecoded, "
                         f"{sum(s.get('overloads', 0) for s in sl):,} pipeline pauses"
                         + (f", capture: {sl[0]['capture']}" if sl[0].get("capture") else ""))
    if notes:
        lines.append("")
        lines.append("Pipeline totals over all rounds: " + "; ".join(notes) + ".")
    return "\n".join(lines)


def _twin_lines(lines: list[str], runs: list[dict[str, Any]], key: str, caption: str,
                fmt: str) -> None:
    """Append, for each mode with a ``--baseline`` twin in ``runs``, its ``key``
    minus the twin's run by run, and their median."""
    out = []
    for m in runs[0]:
        twin = m + TWIN
        ds = [r[m][key] - r[twin][key] for r in runs
              if key in r.get(m, {}) and key in r.get(twin, {})]
        if ds:
            def show(d: float) -> str:
                text = fmt.format(d)
                return fmt.format(0.0) if float(text) == 0 else text  # (no "-0")

            out.append(f"{m}: " + ", ".join(show(d) for d in ds)
                       + f" (median {show(statistics.median(ds))})")
    if out:
        lines += ["", caption + ": " + "; ".join(out) + "."]


def update_file(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else ""
    body = f"{BLOCK_START}\n{block}\n{BLOCK_END}"
    if BLOCK_START in text and BLOCK_END in text:
        pre, rest = text.split(BLOCK_START, 1)
        post = rest.split(BLOCK_END, 1)[1]
        text = pre + body + post
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + "## Proxy\n\n" + body + "\n"
    path.write_text(text)


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an int no less than ``low``."""
    def parse(text: str) -> int:
        v = int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is less than {low}")
        return v
    return parse


def _checkout(text: str) -> Path:
    """An argparse type: a directory, resolved (the proxies run elsewhere)."""
    path = Path(text).resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kinspect proxy benchmark")
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve", help="(internal) run kinspect as the proxy under test")
    sv.add_argument("--mode", choices=KINSPECT_MODES, required=True)
    sv.add_argument("--upstream", required=True)
    sv.add_argument("--listen", required=True)
    sv.add_argument("--capture", required=True)
    sv.add_argument("--profile", help="write a cProfile of the proxy process here")
    sub.add_parser("imported", help="(internal) say what kinspect this process imports")
    cl = sub.add_parser("client", help="(internal) the confluent-kafka workload")
    cl.add_argument("--bootstrap", required=True)
    cl.add_argument("--topic-suffix", default=None)
    for p in (ap, cl):
        p.add_argument("--small", type=int, default=50000, help="100-byte messages")
        p.add_argument("--large", type=int, default=10000, help="10 KiB messages")
        p.add_argument("--latency", type=int, default=1000, help="produce+flush round trips")
        p.add_argument("--warmup", type=int, default=100, help="latency loop warm-up")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=ALL_MODES,
                    help="the modes to run, replacing the default list (%(default)s); "
                         "ratios need direct, differences need forwarder")
    ap.add_argument("--interleaved", type=int, default=2000,
                    help="latency-loop round trips per mode and run, interleaved (0: none)")
    ap.add_argument("--interleaved-runs", type=int, default=5,
                    help="runs of the interleaved latency loop, each on fresh processes")
    ap.add_argument("--bursts", type=_at_least(0), default=30,
                    help="turns of the interleaved 10 KiB produce bursts per run (0: none)")
    ap.add_argument("--burst", type=_at_least(1), default=2000,
                    help="10 KiB messages per burst (each mode's broker keeps every one: "
                         "(bursts + 1) × burst × 10 KiB per run, with the warm-up turn)")
    ap.add_argument("--burst-runs", type=int, default=5,
                    help="runs of the interleaved bursts, each on fresh processes")
    ap.add_argument("--baseline", type=_checkout, metavar="DIR",
                    help="a checkout of kinspect (C extensions built in place) to measure "
                         "beside this one: each kinspect mode gets a twin <mode>@baseline "
                         "run from it")
    ap.add_argument("--idle", type=int, default=500, help="idle connections for memory")
    ap.add_argument("--busy", type=int, default=50, help="busy connections for memory")
    ap.add_argument("--busy-seconds", type=float, default=3.0)
    ap.add_argument("--json", type=Path, help="write raw results here")
    ap.add_argument("--update", type=Path, help="replace the results block in this file")
    ap.add_argument("--from-json", type=Path, help="report from an earlier --json file")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve(args)
    if args.cmd == "client":
        return client(args)
    if args.cmd == "imported":
        print(json.dumps(imported()))
        return 0
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        data = run_bench(args)
        if args.json:
            args.json.write_text(json.dumps(data, indent=1, default=str))
    text = report(data)
    print(text)
    if args.update:
        update_file(args.update, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
