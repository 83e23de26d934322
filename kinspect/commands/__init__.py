"""Subcommands of the ``kinspect`` CLI: one module each, exposing ``register(subparsers)``.

Shared option helpers live here.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path


def add_spec_options(p: argparse.ArgumentParser) -> None:
    """``--specs PATH`` (repeatable): spec directories or jars searched first."""
    p.add_argument("--specs", action="append", default=[], metavar="PATH",
                   help="directory or jar/zip of Kafka JSON message specs, searched before "
                        "KINSPECT_SPECS, the project's specs/ and kafka-python's bundled set "
                        "(repeatable)")


def plain_help(doc: str | None) -> str:
    """A module docstring as ``--help`` text: reST literals (````x````) lose their
    backquotes and a literal-block marker (``Examples::``) becomes one colon."""
    text = (doc or "").replace("``", "")
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def make_codec(args: argparse.Namespace):
    """A :class:`~kinspect.codec.Codec` for the ``--specs`` given on the command line."""
    from ..codec import Codec, SpecRegistry

    return Codec(SpecRegistry.load(args.specs))


def api_names(codec) -> list[str]:
    """The api names ``codec``'s specs define, for :func:`kinspect.filters.parse`."""
    return [codec.api_name(k) for k in codec.registry.api_keys()]


def check_ignore(args: argparse.Namespace, codec) -> None:
    """A usage error (``args.usage_error``) for an ``--ignore`` pattern (replay,
    serve) that could never match: an empty one, ``API:`` naming an api the specs do
    not define (as ``--filter`` refuses one), or a prefix with nothing after it
    (``Fetch:``, ``entity:``)."""
    names = {n.lower() for n in api_names(codec)}
    for pattern in args.ignore:
        text = pattern.strip()
        if not text:
            args.usage_error(f"argument --ignore: an empty pattern ({pattern!r})")
        head, sep, rest = text.partition(":")
        if sep and head != "entity" and head.lower() not in names:
            args.usage_error(f"argument --ignore: no api is named {head!r} in {pattern!r} "
                             f"(kinspect specs lists the api names; entity:TYPE for entity "
                             f"types)")
        if sep and (not rest.strip() or rest.strip() == "entity:"):
            args.usage_error(f"argument --ignore: nothing after {text!r}: a field name, "
                             f"path or entity:TYPE")


def listen_error(e: OSError, host: str | list[str], port: int) -> OSError:
    """``e`` (binding ``host:port`` failed) as ``cannot listen on HOST:PORT: reason``,
    the system's reason as it gave it (a host name that does not resolve too)."""
    from ..proxy.server import format_hostport

    hosts = host if isinstance(host, list) else [host]
    where = ", ".join(format_hostport(h, port) for h in hosts)
    # (asyncio's server words its own strerror; a name lookup's errno is negative)
    reason = (os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0
              else e.strerror or str(e))
    return OSError(e.errno, f"cannot listen on {where}: {reason}")


def hostport(text: str) -> tuple[str, int]:
    """argparse type for ``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    from ..proxy.server import parse_hostport

    try:
        return parse_hostport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _number(kind: type, text: str, minimum: float, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or value < minimum or value == float("inf"):  # (NaN, inf too)
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number of seconds (or a factor) above 0."""
    value = _number(float, text, 0, "a number above 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a number, 0 or more."""
    return _number(float, text, 0, "a number, 0 or more")


def positive_int(text: str) -> int:
    """argparse type: a whole number, 1 or more."""
    return _number(int, text, 1, "a whole number, 1 or more")


def nonnegative_int(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    return _number(int, text, 0, "a whole number, 0 or more")


def positive_size(text: str) -> int:
    """argparse type: a byte size above 0 (``1048576``, ``64K``, ``1MiB``, ``1G``)."""
    from ..units import parse_size

    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size above 0, got {text!r}")
    return value


def is_terminal(stream) -> bool:
    """Whether ``stream`` (``sys.stdin``, ``sys.stdout``) is an open terminal."""
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed
        return False


def check_capture_found(path: str) -> None:
    """Raise :class:`FileNotFoundError` saying "did you mean captures/NAME?" when the
    capture ``path`` (a bare name) does not exist but ``captures/NAME`` does: where
    ``--capture NAME`` wrote it. Otherwise nothing (the reader reports what is wrong)."""
    from ..capture import resolve_capture_path

    there = resolve_capture_path(path)
    if not os.path.exists(path) and str(there) != path and there.exists():
        raise FileNotFoundError(errno.ENOENT, f"no such file (did you mean {there}?)", path)


def check_writable(path: str) -> None:
    """Raise :class:`OSError` now if ``path`` cannot be written later: a directory,
    in a directory that does not exist, an existing file that is not writable, or a
    new file in a directory that is not (the file itself is written at the end)."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a report file", path)
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "no such directory for the report", path)
    # (an existing file needs only its own permission: e.g. /dev/null as a non-root user)
    if not os.access(path if os.path.exists(path) else parent, os.W_OK):
        raise PermissionError(errno.EACCES, "cannot write the report", path)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether the paths ``a`` and ``b`` name the same file: the same file on disk
    when both exist (links followed, hard links too: ``os.path.samefile``), else the
    same absolute path once symbolic links are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def check_not_input(output: str | None, inputs: Iterable[str | None], *,
                    parts: bool = False) -> None:
    """Refuse an output file that is one of the command's inputs, before anything is
    read or written: writing it would destroy the input (as tshark refuses ``-w``
    naming the file ``-r`` reads). ``-`` (stdout, stdin) and ``None`` are never files;
    an output that exists and is no regular file (a terminal, ``/dev/null``, a pipe)
    is never refused. (A missing input named as the output is: opening the output
    would create the input, empty.)
    With ``parts``, the inputs are captures and their rotated parts count too
    (``cap.1.jsonl``..., as the readers follow them).

    Raises:
        OSError: ``EINVAL``, naming ``output`` and the input it is.
    """
    if output is None or output == "-" or (os.path.exists(output)
                                           and not os.path.isfile(output)):
        return  # (a terminal, /dev/null, a pipe: nothing there to destroy)
    from ..capture import capture_parts

    for given in inputs:
        if given is None or given == "-":
            continue
        for path in capture_parts(given) if parts else [Path(given)]:
            if same_file(output, path):
                which = "" if str(path) == output else f" ({path})"
                raise OSError(errno.EINVAL, f"is an input of this command{which}: writing "
                              f"there would destroy it", output)


def capture_path(text: str) -> str:
    """argparse type for a CAPTURE argument: a file name; ``-`` (stdin) is refused
    with the reason (a capture is read more than once, rotated parts are found next
    to it), not reported as a missing file named "-"."""
    if text == "-":
        raise argparse.ArgumentTypeError(
            "a capture is read from a file, not from stdin: save it first (a .jsonl.gz "
            "is read as it is, no need to gunzip it)")
    return text
