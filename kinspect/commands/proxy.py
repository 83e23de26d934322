"""``kinspect proxy`` and ``kinspect demo``: the main job."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from typing import Any, Callable

from . import (
    add_spec_options,
    api_names,
    hostport,
    is_terminal,
    listen_error,
    make_codec,
    nonnegative_float,
    positive_float,
    positive_int,
    positive_size,
)

log = logging.getLogger("kinspect")


def _add_view_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-tui", action="store_true",
                   help="print one line per flow instead of the live table (the default "
                        "when stdout is not a terminal)")
    p.add_argument("--no-decode", action="store_true",
                   help="forward and count only; do not decode bodies")
    p.add_argument("--filter", metavar="EXPR", default=None,
                   help="show only flows matching a filter expression, e.g. '~api Produce | ~err'")
    p.add_argument("--max-frame", type=positive_size, default=100 * 1024 * 1024, metavar="BYTES",
                   help="largest frame accepted (default 100 MiB, like socket.request.max.bytes; "
                        "suffixes K, M, G)")
    p.add_argument("--advertise-host", default=None, metavar="HOST",
                   help="host written into rewritten broker addresses (default: the listen "
                        "host, or 127.0.0.1 for a wildcard listen address)")
    p.add_argument("--no-rewrite", action="store_true",
                   help="do not rewrite broker addresses (clients may then bypass the proxy)")
    p.add_argument("--max-listeners", type=positive_int, default=256, metavar="N",
                   help="most listeners, one per broker address the responses name "
                        "(default 256); a response naming more is forwarded unchanged")
    add_spec_options(p)
    _optional_options(p)


def _optional_options(p: argparse.ArgumentParser) -> None:
    from ..capture import add_capture_options
    from ..proxy.rules import add_rules_options

    add_capture_options(p)
    add_rules_options(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="run the proxy between Kafka clients and a broker",
                       description="Forward Kafka traffic between clients and brokers, "
                                   "decode every request and response, show them live. "
                                   "In the live view, Up/Down select a row, Enter opens "
                                   "its flow decoded, Esc goes back, End follows the "
                                   "newest rows again, f types a filter.")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", type=hostport,
                   help="bootstrap broker to forward to")
    p.add_argument("--listen", default=("127.0.0.1", 19092), metavar="HOST:PORT", type=hostport,
                   help="where clients connect (default 127.0.0.1:19092); further brokers "
                        "get the following ports (port-per-broker)")
    _add_view_options(p)
    p.set_defaults(func=run_proxy)

    d = sub.add_parser("demo", help="start a local Tansu broker, the proxy and a real client "
                                    "workload, and show the flows live",
                       description="The embedded default: a bundled Tansu broker (memory "
                                   "storage, free loopback port), the proxy in front of it and "
                                   "a kafka-python workload (create a topic, produce, consume "
                                   "in a group) through it. Stops everything on exit.")
    d.add_argument("--listen", default=("127.0.0.1", 0), metavar="HOST:PORT", type=hostport,
                   help="proxy listen address (default: a free loopback port)")
    d.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                   help="stop after this long (default: run until Ctrl-C)")
    d.add_argument("--rounds", type=positive_int, default=None, metavar="N",
                   help="stop after N produce/consume rounds")
    d.add_argument("--messages", type=positive_int, default=10, metavar="N",
                   help="messages per round (default 10)")
    d.add_argument("--interval", type=nonnegative_float, default=1.0, metavar="SECONDS",
                   help="pause between rounds (default 1 s)")
    _add_view_options(d)
    d.set_defaults(func=run_demo)


def _build(args: argparse.Namespace, upstream: tuple[str, int], listen: tuple[str, int]):
    from ..proxy.pipeline import Pipeline
    from ..proxy.server import Proxy, ProxyConfig

    codec = make_codec(args)
    config = ProxyConfig(upstream=upstream, listen=listen, advertise_host=args.advertise_host,
                         rewrite=not args.no_rewrite, max_frame=args.max_frame,
                         max_listeners=args.max_listeners)
    pipeline = Pipeline(codec, decode=not args.no_decode)
    proxy = Proxy(config, codec, pipeline)
    return proxy, codec


def _view(args: argparse.Namespace, proxy: Any, title: str):
    from ..tui import LinePrinter, LiveView

    match = None
    if args.filter:
        from ..filters import parse

        match = parse(args.filter, api_names(proxy.codec))
    if args.no_tui or not sys.stdout.isatty():
        return LinePrinter(match=match)
    from rich.console import Console

    console = Console()
    # a dumb terminal (TERM=dumb: Emacs shell buffers, some CI logs) cannot move the
    # cursor, so rich's Live would draw nothing until the proxy stops
    if console.is_dumb_terminal:
        return LinePrinter(match=match)
    return LiveView(proxy, console=console, match=match, title=title)


async def _serve(args: argparse.Namespace, proxy: Any, title: str,
                 stop: asyncio.Event, started: "asyncio.Future | None" = None) -> None:
    """Run the proxy until ``stop`` is set.

    What can fail before any traffic (a bad filter, bad rules, a listen address in
    use) is checked before the capture file is created, so a failed start leaves an
    existing capture as it was; once the capture exists, it is closed (its child
    stopped) whatever happens next."""
    from rich.console import Console

    from ..capture import capture_addon_from_args
    from ..proxy.rules import install_rules

    codec = proxy.codec
    # (to a file or pipe: full width, so the rules' table on exit keeps its columns)
    err_console = Console(stderr=True, width=None if is_terminal(sys.stderr) else 1000)
    view = _view(args, proxy, title)
    ruleset = install_rules(args, proxy, codec, err_console)
    try:
        listen = proxy.listen_address()
    except OSError as e:  # name the address: "[Errno 98] Address already in use" alone does not
        raise listen_error(e, *proxy.config.listen) from None
    try:
        capture = capture_addon_from_args(args, proxy.config, codec, listen)
        if capture is not None:
            proxy.pipeline.add(capture)
            # (a bare name goes under captures/: say where, or `show NAME` finds nothing)
            print(f"kinspect: capturing to {capture.path}", file=sys.stderr, flush=True)
        proxy.pipeline.add(view)
        await proxy.start()
        if not hasattr(view, "start"):
            # the address bound, and the one clients bootstrap from when it differs
            # (--advertise-host, a wildcard listen address)
            from ..proxy.server import format_hostport

            bound, told = format_hostport(*listen), format_hostport(*proxy.address)
            print(f"kinspect: listening on {bound}"
                  + (f" (clients bootstrap from {told})" if told != bound else "")
                  + f", forwarding to {format_hostport(*proxy.config.upstream)}",
                  file=sys.stderr, flush=True)
        else:
            # keys select and open rows when someone types at a terminal (stdin)
            view.start(keys=sys.stdin.fileno() if is_terminal(sys.stdin) else None)
        if started is not None and not started.done():
            started.set_result(proxy.address)
        await stop.wait()
    finally:
        await proxy.close()
        if len(ruleset):
            err_console.print(ruleset.table())


def _install_signals(stop: asyncio.Event, again: asyncio.Event | None = None) -> None:
    """Stop on SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed) and SIGQUIT
    (Ctrl-\\): by default SIGHUP and SIGQUIT kill the process at once, which would
    leave the terminal in the live view's cbreak mode, and ``kinspect demo``'s broker
    (in a session of its own, so not hung up with the terminal) running. A signal
    after the first sets ``again`` (given): stop now, without waiting any more."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set() and again is not None:
            again.set()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
            pass


def run_proxy(args: argparse.Namespace) -> int:
    from ..proxy.server import install_uvloop

    install_uvloop()
    upstream, listen = args.upstream, args.listen

    async def main() -> None:
        stop = asyncio.Event()
        _install_signals(stop)
        proxy, _ = _build(args, upstream, listen)
        await _serve(args, proxy, "kinspect proxy", stop)

    asyncio.run(main())
    return 0


#: seconds the demo waits, once told to stop, for its workload's current step
_WORKLOAD_STOP_TIMEOUT = 30.0


def _in_daemon_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> asyncio.Future:
    """Run ``fn()`` in a daemon thread; its outcome as a future of ``loop``. Not the
    loop's executor, whose threads ``asyncio.run`` and the interpreter's exit wait
    for: a workload stuck in a client call would hold the demo up after Ctrl-C."""
    fut = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            outcome: tuple = (fn(), None)
        except BaseException as e:  # noqa: BLE001 - handed to the future
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=run, name="kinspect-demo-workload", daemon=True).start()
    return fut


async def _workload_outcome(worker: asyncio.Future, now: asyncio.Event, *,
                            grace: float = 1.0,
                            timeout: float = _WORKLOAD_STOP_TIMEOUT) -> Any:
    """The demo's workload result once it was told to stop, or ``None`` when it failed
    (said on stderr) or was abandoned: a client call under way (a group join takes
    seconds) is waited for, said after ``grace`` seconds, up to ``timeout`` seconds or
    until ``now`` is set (Ctrl-C again); an abandoned workload's thread is a daemon
    (:func:`_in_daemon_thread`), so it neither holds up the exit nor outlives it, and
    its kafka-python clients' logging is silenced from then on."""
    forced = asyncio.ensure_future(now.wait())
    try:
        await asyncio.wait({worker, forced}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        if not worker.done() and not now.is_set():
            print("kinspect demo: stopping once the workload's current step ends "
                  "(Ctrl-C again to stop now)…", file=sys.stderr, flush=True)
            await asyncio.wait({worker, forced}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
    finally:
        forced.cancel()
    if not worker.done():
        print("kinspect demo: workload abandoned in the middle of a step", file=sys.stderr)
        # its kafka-python clients, left running in their daemon thread, fail as the
        # proxy closes their connections: their errors (tracebacks among them, from
        # their own shutdown) would say nothing the line above does not
        logging.getLogger("kafka").setLevel(logging.CRITICAL + 1)
        return None
    if worker.exception() is not None:
        print(f"kinspect demo: workload failed: {worker.exception()}", file=sys.stderr)
        return None
    return worker.result()


def run_demo(args: argparse.Namespace) -> int:
    from ..brokers import TansuBroker
    from ..proxy.server import install_uvloop
    from ..workload import run_forever

    install_uvloop()
    listen = args.listen
    print("kinspect demo: starting a Tansu broker (memory storage) on a free loopback port…",
          file=sys.stderr, flush=True)
    with TansuBroker() as broker:
        host, port = broker.bootstrap.rsplit(":", 1)

        async def main() -> None:
            stop = asyncio.Event()  # Ctrl-C, --duration or --rounds done
            now = asyncio.Event()  # Ctrl-C again: do not wait for the workload
            proxy_stop = asyncio.Event()  # set once the workload has finished
            _install_signals(stop, now)
            proxy, _ = _build(args, (host, int(port)), listen)
            started: asyncio.Future = asyncio.get_running_loop().create_future()
            server = asyncio.create_task(_serve(args, proxy, "kinspect demo", proxy_stop,
                                                started))
            done, _ = await asyncio.wait({server, started}, return_when=asyncio.FIRST_COMPLETED)
            if server in done:
                server.result()
                return
            bootstrap = "%s:%d" % started.result()
            stop_workload = threading.Event()
            loop = asyncio.get_running_loop()

            def work() -> Any:
                return run_forever(bootstrap, stop_workload, messages=args.messages,
                                   interval=args.interval, rounds=args.rounds)

            worker = _in_daemon_thread(loop, work)
            if args.duration is not None:
                loop.call_later(args.duration, stop.set)
            worker.add_done_callback(lambda _: args.rounds is not None and stop.set())
            await stop.wait()
            stop_workload.set()
            result = await _workload_outcome(worker, now)
            proxy_stop.set()
            await server
            if result is not None:
                print(f"kinspect demo: {result.produced} messages produced, "
                      f"{result.consumed} consumed, in {result.rounds} "
                      f"round{'' if result.rounds == 1 else 's'}", file=sys.stderr)

        asyncio.run(main())
    print("kinspect demo: broker stopped.", file=sys.stderr)
    return 0
