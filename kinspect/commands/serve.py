"""``kinspect serve CAPTURE``: act as a broker that answers from a capture.

Real clients connect to ``--listen`` and get the recorded response of the
best-matching recorded request (same api and version; then equal body; then equal
after ignoring volatile fields; then the closest), with their own correlation ids
and broker addresses pointing back at this listener. Requests without a recorded
counterpart get the api's error response (or a disconnect when it has no error
field) and are logged.

Examples::

    kinspect serve captures/run.jsonl                      # 127.0.0.1:9092
    kinspect serve captures/run.jsonl --listen 127.0.0.1:19092 -v

Stops on Ctrl-C or SIGTERM and prints what it served.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from . import (
    add_spec_options,
    capture_path,
    check_capture_found,
    check_ignore,
    hostport,
    listen_error,
    make_codec,
    plain_help,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="act as a broker answering from a capture file",
                       description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", metavar="CAPTURE", type=capture_path, help="capture file (.jsonl or .jsonl.gz)")
    p.add_argument("--listen", default=("127.0.0.1", 9092), metavar="HOST:PORT", type=hostport,
                   help="address to listen on (default 127.0.0.1:9092; port 0 = any free port)")
    p.add_argument("--advertise-host", metavar="HOST",
                   help="host written into broker addresses (default: the listen host; "
                        "127.0.0.1 for 0.0.0.0, ::1 for ::)")
    p.add_argument("--ignore", action="extend", nargs="+", default=[], metavar="FIELD",
                   help="more volatile fields for request matching (see kinspect replay)")
    p.add_argument("--as-received", action="store_true",
                   help="answer with the broker's responses as the proxy received them "
                        "(default: as it forwarded them to the recorded client, with what "
                        "its rules changed)")
    add_spec_options(p)
    p.set_defaults(func=run, usage_error=p.error)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from ..replay import DEFAULT_IGNORE, load_flows, run_with_uvloop
    from ..serve import CaptureBroker

    listen = args.listen
    check_capture_found(args.capture)
    codec = make_codec(args)
    check_ignore(args, codec)
    flows = load_flows(args.capture, codec)
    console = Console(stderr=True)
    broker = CaptureBroker(codec, flows, listen, ignore=list(DEFAULT_IGNORE) + args.ignore,
                           advertise_host=args.advertise_host, as_sent=not args.as_received)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            await broker.start()
        except OSError as e:  # as the proxy says it: the address, then the system's reason
            raise listen_error(e, *listen) from None
        host, port = broker.address
        console.print(f"serving {len(broker.index)} recorded responses from "
                      f"[bold]{escape(args.capture)}[/] on [bold]{escape(host)}:{port}[/]",
                      highlight=False)
        try:
            await stop.wait()
        finally:
            await broker.close()

    try:
        run_with_uvloop(main())
    except KeyboardInterrupt:
        pass
    s = broker.stats
    console.print(f"served {s.requests} request(s) on {s.connections} connection(s): "
                  f"{s.exact} exact, {s.normalized} equal after ignoring volatile fields, "
                  f"{s.closest} closest, {s.reused} reused, {s.api_versions_reencoded} "
                  f"ApiVersions re-encoded, {s.synthesized} Heartbeat(s) answered without a "
                  f"recording, {s.unmatched} unmatched, {s.disconnects} "
                  f"disconnect(s), {s.errors} error(s)", highlight=False)
    return 0
