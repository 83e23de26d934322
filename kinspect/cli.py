"""The ``kinspect`` command line.

Each subcommand lives in a module of :mod:`kinspect.commands` that defines
``register(subparsers)``; modules are discovered, so features add commands
without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import warnings

from . import __version__, commands
from .codec.errors import KinspectError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinspect",
        description="Kafka wire-traffic proxy and inspector.")
    parser.add_argument("--version", action="version", version=f"kinspect {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    for command in sub.choices.values():
        # after the command too (its examples write `kinspect serve ... -v`), counted
        # with those before it (main() adds them up)
        if "-v" not in command._option_string_actions:
            command.add_argument("-v", "--verbose", action="count", default=0,
                                 dest="verbose_after", help="more logging (-v info, -vv debug)")
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings of kinspect's own (a capture's torn last line, ...) as one line for
    the user, ``kinspect: warning: ...``, not Python's file:line and source line.
    Other warnings (from libraries) keep Python's format. (The format, not
    ``warnings.showwarning``: replacing that would hide warnings from
    ``warnings.catch_warnings(record=True)``.)"""
    if issubclass(category, Warning) and category.__module__.split(".")[0] == "kinspect":
        return f"kinspect: warning: {message}\n"
    return _python_formatwarning(message, category, filename, lineno, line)


_python_formatwarning = warnings.formatwarning


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no real stdout
        return False


def quiet_broken_pipe() -> None:
    """stdout's reader went away (``kinspect show ... | head``): point stdout at
    /dev/null so the interpreter's final flush does not report the broken pipe (also
    used by the live view's line printer)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no real stdout
        pass


def _os_error_text(e: OSError) -> str:
    """``FILE: reason`` (``x.json: Is a directory``), not ``[Errno 21] Is a directory:
    'x.json'``; other errors as they are."""
    if e.strerror and e.filename:
        return f"{e.filename}: {e.strerror}"
    return e.strerror or str(e)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None
               ) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with ``verbose`` counting each ``-v`` before the
    command and after it."""
    args = parser.parse_args(argv)
    args.verbose += getattr(args, "verbose_after", 0)
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warnings.formatwarning = _format_warning
    # a stdout that is not UTF-8 (PYTHONIOENCODING=ascii, a latin-1 locale): what it
    # cannot encode is written as \uNNNN escapes, not a UnicodeEncodeError traceback
    # (client ids, topic names and the tables' box characters are not ASCII)
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower()
    if not encoding.startswith("utf") and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError as e:
        if not _stdout_gone():  # a socket's broken pipe: an error like any other
            print(f"kinspect: error: {e}", file=sys.stderr)
            return 1
        # quietly, with status 1: as the commands that print through rich (whose
        # console does the same), and as Python's own advice for EPIPE
        quiet_broken_pipe()
        return 1
    except KinspectError as e:
        print(f"kinspect: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a listen port in use, a file that cannot be read
        print(f"kinspect: error: {_os_error_text(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
