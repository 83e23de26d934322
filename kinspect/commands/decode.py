"""``kinspect decode`` / ``kinspect encode``: one frame (or a JSON Lines batch) to
readable JSON and back to the identical bytes.

Single frame::

    kinspect decode frame.bin                       # raw bytes (size prefix optional)
    kinspect decode --hex < frame.hex --format tree
    kinspect decode --base64 resp.b64 --api-key Metadata --api-version 12
    kinspect decode resp.bin --request req.bin      # type a response by its request
    kinspect decode frame.bin | kinspect encode > same.bin

Batch (logs, captures)::

    kinspect decode --jsonl capture.jsonl > decoded.jsonl
    kinspect encode --jsonl decoded.jsonl > capture-again.jsonl

Input lines are ``{"conn": ..., "dir": "req"|"resp", "frame": "<base64, no size
prefix>", ...}``; capture files (kinspect's capture format, ``.jsonl`` or
``.jsonl.gz``) are a superset and work as they are. ``conn`` is an integer, as in
captures (a line with another value is an error line; lines without ``conn`` are
taken as one connection). A response is typed by the request with its correlation
id on the same ``conn`` (or by the line's own ``api_key``/``api_version``). Each output line keeps every input key in place and
puts ``"decoded"`` where ``"frame"`` was; ``kinspect encode --jsonl`` puts the
re-encoded ``"frame"`` back, so decode then encode reproduces the input lines. A
frame that fails to decode (or whose ``"frame"`` is not base64 text) keeps its
``"frame"`` and gains an ``"error"`` object (DecodeError's ``error``, ``offset``,
``expected``, ``path``, ``api``, ``version``); the run goes on. A line that is not
JSON (or not UTF-8) becomes ``{"line": N, "error": {...}}`` (with ``"file"`` when it
is in a rotated part). Lines without a frame (capture session/conn lines) pass
through. As ``kinspect show`` does, the rotated parts of a capture (``cap.1.jsonl``
...) are read after it, a torn last line (a capture still being written) is skipped
with a warning, and a ``.jsonl.gz`` cut short (its writer killed) is read up to the
cut, then a warning says how many lines were read; compressed data that is corrupt
(a CRC mismatch, bad deflate data) is an error.

Exit status of a batch: 0 when every line converted (or passed through), 1 when
any line failed (every line is still written) or the input could not be read on.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import gzip
import json
import struct
import sys
import zlib
from collections.abc import Iterator
from typing import Any

from . import add_spec_options, check_not_input, make_codec, plain_help

_SIZE = struct.Struct(">i")


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("decode", help="decode one frame (or a JSONL batch) to JSON or a tree",
                       description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_spec_options(d)
    _input_options(d)
    d.add_argument("--format", choices=("json", "tree"), default="json",
                   help="output format for a single frame (default json)")
    d.add_argument("--api-key", metavar="KEY",
                   help="decode a response of this api (number or name, e.g. Metadata)")
    d.add_argument("--api-version", type=int, metavar="N",
                   help="the api version of the request the response answers")
    d.add_argument("--request", metavar="FILE",
                   help="the request frame a response answers (read like the input)")
    d.add_argument("--response", action="store_true",
                   help="the frame is a response (implied by --api-key or --request)")
    d.add_argument("--strict", action="store_true",
                   help="bytes after the message are an error (by default the message is "
                        "decoded as Kafka's parsers read it, which never look past it, and "
                        "the bytes after it are kept under 'trailing', with a warning)")
    d.set_defaults(func=run_decode, usage_error=d.error)

    e = sub.add_parser("encode", help="encode decoded JSON (or a decoded JSONL batch) back "
                                      "to frame bytes",
                       epilog="exit status with --jsonl: 0 when every line encoded (or passed "
                              "through), 1 when any line failed (every line is still "
                              "written) or the input could not be read on")
    add_spec_options(e)
    e.add_argument("file", nargs="?", default="-",
                   help="JSON from 'kinspect decode' (default: stdin)")
    e.add_argument("--jsonl", metavar="FILE",
                   help="batch: decoded JSON Lines in, the same lines with 'frame' out")
    fmt = e.add_mutually_exclusive_group()
    fmt.add_argument("--hex", action="store_true", help="write hex text")
    fmt.add_argument("--base64", action="store_true", help="write base64 text")
    e.add_argument("--size-prefix", action="store_true",
                   help="prepend the 4-byte size prefix of the wire")
    e.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    e.set_defaults(func=run_encode, usage_error=e.error)


def _input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", default="-", help="frame file (default: stdin)")
    p.add_argument("--jsonl", metavar="FILE",
                   help="batch: one frame per JSON line (capture files work as they are)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--hex", action="store_true", help="input is hex text")
    fmt.add_argument("--base64", action="store_true", help="input is base64 text")
    p.add_argument("--size-prefix", choices=("auto", "yes", "no"), default="auto",
                   help="whether the input starts with the 4-byte size prefix "
                        "(auto: when it equals the length of the rest)")
    p.add_argument("-o", "--output", default="-", help="output file (default: stdout)")


# ---------------------------------------------------------------------------
# reading frames


class InputError(ValueError):
    """Input that is not a frame in the announced encoding."""


def read_frame(path: str, args: argparse.Namespace) -> bytes:
    """The frame in ``path`` (``-`` = stdin) as bytes, without the size prefix.

    Raises:
        InputError: bad hex/base64 text, or a size prefix that does not match.
    """
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(path, "rb") as fh:
            data = fh.read()
    if args.hex or args.base64:
        text = data.decode("ascii", errors="replace")
        try:
            if args.hex:
                cleaned = "".join(text.split()).replace(":", "")
                if cleaned.lower().startswith("0x"):
                    cleaned = cleaned[2:]
                data = bytes.fromhex(cleaned)
            else:
                data = base64.b64decode("".join(text.split()), validate=True)
        except (ValueError, binascii.Error) as e:
            raise InputError(f"{path}: not valid {'hex' if args.hex else 'base64'}: {e}") from None
    return strip_size_prefix(data, args.size_prefix)


def strip_size_prefix(data: bytes, mode: str) -> bytes:
    has = len(data) >= 4 and _SIZE.unpack_from(data)[0] == len(data) - 4
    if mode == "yes":
        if not has:
            got = _SIZE.unpack_from(data)[0] if len(data) >= 4 else None
            raise InputError(f"size prefix {got} does not match the {max(len(data) - 4, 0)} "
                             f"bytes that follow")
        return data[4:]
    if mode == "auto" and has:
        return data[4:]
    return data


# ---------------------------------------------------------------------------
# frames <-> dicts


def message_to_dict(msg: Any) -> dict[str, Any]:
    """A decoded Request/Response as JSON-able dict (``type``, ``api``, ``api_key``,
    ``api_version``, ``correlation_id``, ``header_version``, ``header``, ``body``;
    for a response decoded at another version, ``body_version``; for a frame with
    bytes after its body, which Kafka's parsers do not read, ``trailing`` as hex)."""
    from ..codec import Request

    d = {"type": "request" if isinstance(msg, Request) else "response"}
    d.update(msg.to_dict())
    d["correlation_id"] = msg.correlation_id
    order = ["type", "api", "api_key", "api_version", "correlation_id", "header_version",
             "body_version", "header", "body", "trailing"]
    return {k: d[k] for k in order if k in d}


#: header versions there are: request v0-v2, response v0-v1 (KIP-482 added the last)
_HEADER_VERSIONS = {"request": (0, 1, 2), "response": (0, 1)}


def message_from_dict(codec: Any, d: dict[str, Any]) -> Any:
    """Rebuild a Request/Response from :func:`message_to_dict`'s shape.

    Raises:
        EncodeError: missing keys, unknown api key, or values of the wrong shape.
    """
    from ..codec import EncodeError, Request, Response

    if not isinstance(d, dict):
        raise EncodeError(f"expected a JSON object, got {type(d).__name__}")
    try:
        kind = d.get("type") or ("request" if "client_id" in d else None)
        api_key = int(d["api_key"])
        api_version = int(d["api_version"])
    except (KeyError, TypeError, ValueError) as e:
        raise EncodeError(f"missing or bad api_key/api_version: {e}") from None
    if kind not in ("request", "response"):
        raise EncodeError(f"'type' must be 'request' or 'response', got {kind!r}")
    name = codec.api_name(api_key)
    hv = d.get("header_version")
    if hv is not None and (type(hv) is not int or hv not in _HEADER_VERSIONS[kind]):
        raise EncodeError(f"'header_version' of a {kind} must be one of "
                          f"{', '.join(map(str, _HEADER_VERSIONS[kind]))}, got {hv!r}")
    if kind == "request":
        spec = codec.registry.request(api_key)
        if hv is None:
            hv = codec.request_header_version(api_key, api_version)
        hcodec = codec.registry.header("RequestHeader")
    else:
        spec = codec.registry.response(api_key)
        if hv is None:
            hv = codec.response_header_version(api_key, api_version)
        hcodec = codec.registry.header("ResponseHeader")
    if spec is None or hv is None:
        raise EncodeError(f"no spec for {kind} api key {api_key} version {api_version}")
    body_version = d.get("body_version", api_version)
    if type(body_version) is not int:
        raise EncodeError(f"'body_version' must be an integer, got {body_version!r}")
    header = hcodec.cls.from_dict(d["header"]) if d.get("header") is not None else None
    body = codec.registry.codec(spec).cls.from_dict(d.get("body") or {})
    corr = d.get("correlation_id")
    if header is not None:
        corr = header.CorrelationId
    if corr is None:
        raise EncodeError("missing correlation_id (or header)")
    trailing = d.get("trailing")
    try:
        if trailing is not None and type(trailing) is not str:
            raise ValueError
        trailing = bytes.fromhex(trailing or "")
    except ValueError:
        raise EncodeError(f"'trailing' must be a string of hex digits, "
                          f"got {json.dumps(d.get('trailing'))}") from None
    if kind == "request":
        client_id = header.ClientId if header is not None and hv >= 1 else d.get("client_id")
        return Request(api_key, api_version, corr, client_id, hv, header, body, 0, name,
                       trailing)
    return Response(api_key, api_version, corr, hv, header, body, 0, name, body_version,
                    trailing)


def encode_message(codec: Any, msg: Any) -> bytes:
    from ..codec import Request

    return codec.encode_request(msg) if isinstance(msg, Request) else codec.encode_response(msg)


# ---------------------------------------------------------------------------
# tree output


def _tree(msg: Any):
    """``--format tree``: a title line, then the message's header and body as
    ``kinspect show --flow`` draws them (fields of their versions only, record
    batches decoded, bytes cut at 64)."""
    from rich.text import Text
    from rich.tree import Tree

    from ..show import message_nodes

    kind = "Request" if msg.__class__.__name__ == "Request" else "Response"
    root = Tree(Text.assemble((f"{kind} {msg.api_name} v{msg.api_version}", "bold"),
                              f" (api key {msg.api_key}, correlation id {msg.correlation_id})"))
    message_nodes(root, msg, 64, None, msg.api_version)
    return root


# ---------------------------------------------------------------------------
# decode


#: options of one frame that a batch (--jsonl) would ignore: (attribute, option, default)
_ONE_FRAME = {
    "decode": [("file", "FILE", "-"), ("format", "--format", "json"), ("hex", "--hex", False),
               ("base64", "--base64", False), ("size_prefix", "--size-prefix", "auto"),
               ("api_key", "--api-key", None), ("api_version", "--api-version", None),
               ("request", "--request", None), ("response", "--response", False)],
    "encode": [("file", "FILE", "-"), ("hex", "--hex", False), ("base64", "--base64", False),
               ("size_prefix", "--size-prefix", False)],
}


def _check_batch(args: argparse.Namespace, verb: str) -> None:
    """A usage error for an option of one frame given with ``--jsonl``, which would
    ignore it (each line says what its frame is; the output is JSON Lines)."""
    if not args.jsonl:
        return
    given = [option for name, option, default in _ONE_FRAME[verb]
             if getattr(args, name, default) != default]
    if given:
        what = "a frame file" if given[0] == "FILE" else f"argument {given[0]}"
        args.usage_error(f"{what}: not allowed with argument --jsonl (a batch: each line "
                         f"says what its frame is, and the output is JSON Lines)")


def _check_output(args: argparse.Namespace, files: list[str | None]) -> None:
    """Refuse ``-o`` naming an input: the frame files, or the ``--jsonl`` capture
    and its rotated parts (the output is opened before the batch is read: it would
    be emptied first). Raises OSError (see :func:`check_not_input`)."""
    check_not_input(args.output, files)
    check_not_input(args.output, [args.jsonl], parts=True)


def _open_out(path: str, binary: bool = False):
    if path == "-":
        return sys.stdout.buffer if binary else sys.stdout
    return open(path, "wb" if binary else "w", encoding=None if binary else "utf-8")


def _error_text(e: Exception) -> str:
    from ..codec import DecodeError

    if isinstance(e, DecodeError):
        where = []
        if e.path:
            where.append(f"path {e.path}")
        if e.offset is not None:
            where.append(f"offset {e.offset}")
        return f"decode error: {e}" + (f" [{', '.join(where)}]" if where else "")
    if isinstance(e, OSError) and e.strerror:  # "x.bin: No such file or directory"
        return f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e.strerror}"
    return f"error: {e}"  # (not the exception's class name: InputError, IsADirectoryError...)


def run_decode(args: argparse.Namespace) -> int:
    from ..codec import DecodeError

    _check_batch(args, "decode")
    _check_output(args, [args.file, args.request])
    codec = make_codec(args)
    if args.jsonl:
        return _decode_jsonl(codec, args)
    try:
        if args.api_version is not None and args.api_key is None and args.request is None:
            # (it would be ignored: a request frame carries its own version)
            raise InputError("--api-version types a response: give --api-key with it")
        frame = read_frame(args.file, args)
        response = args.response or args.api_key is not None or args.request is not None
        if response:
            api_key, api_version = _response_type(codec, args)
            msg = codec.decode_response(frame, api_key, api_version, strict=args.strict)
        else:
            msg = codec.decode_request(frame, strict=args.strict)
    except (DecodeError, InputError, OSError) as e:
        print(f"kinspect: {_error_text(e)}", file=sys.stderr)
        return 1
    if msg.trailing:
        print(f"kinspect: warning: {len(msg.trailing)} bytes after the message, at offset "
              f"{len(frame) - len(msg.trailing)}, which Kafka's parsers do not read (kept "
              f"under 'trailing'; --strict refuses them)", file=sys.stderr)
    out = _open_out(args.output)
    try:
        if args.format == "tree":
            from rich.console import Console

            Console(file=out, width=120, soft_wrap=True).print(_tree(msg))
        else:
            out.write(json.dumps(message_to_dict(msg), indent=2) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _response_type(codec: Any, args: argparse.Namespace) -> tuple[int, int]:
    from ..codec import DecodeError

    if args.request is not None:
        req = codec.decode_request(read_frame(args.request, args), body=False)
        return req.api_key, req.api_version
    if args.api_key is None or args.api_version is None:
        raise InputError("a response needs --api-key and --api-version, or --request FILE")
    try:
        key = codec.registry.api_key(args.api_key)
    except KeyError:
        raise DecodeError(f"unknown api {args.api_key!r}") from None
    return key, args.api_version


def _lines(path: str, verb: str = "decode") -> Iterator[tuple[str, int, bytes]]:
    """``(file, line number, line)`` of ``path`` (``-``: stdin) and of its rotated
    parts (``cap.1.jsonl``... of the same capture, as :func:`kinspect.capture.read_capture`
    follows them), gzip or not; lines are bytes, the last one of a file may lack its
    newline. A gzip stream cut short (a capture whose writer was killed) ends that
    file's lines with a warning on stderr, like ``kinspect show``: the lines before
    the cut are all there is.

    Raises:
        InputError: a line of a gzip file longer than
            :data:`~kinspect.capture.MAX_LINE_BYTES` bytes once decompressed (as for
            ``kinspect show``), or compressed data that is corrupt (a CRC mismatch,
            bad deflate data), naming the file.
    """
    from ..capture import capture_parts, part_continues

    if path == "-":
        for n, line in enumerate(sys.stdin.buffer, 1):
            yield path, n, line
        return
    start: Any = None
    for i, part in enumerate(capture_parts(path)):
        name = path if i == 0 else str(part)
        first = True
        for n, line in _file_lines(name, verb):
            if first and not line.isspace():
                first = False
                head = _session_head(line)
                if i == 0:
                    start = head.get("start_ns") if head.get("type") == "session" else None
                elif not part_continues(head, start):
                    return  # not a part of this capture
            yield name, n, line


def _session_head(line: bytes) -> dict:
    """The first line of a file as a JSON object, ``{}`` when it is none."""
    try:
        head = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return head if isinstance(head, dict) else {}


def _file_lines(path: str, verb: str) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of one file, gzip or not (see :func:`_lines`)."""
    from pathlib import Path

    from ..capture import MAX_LINE_BYTES, _open_read

    raw = _open_read(Path(path))  # gzip told by its first bytes, as captures are read
    compressed = isinstance(raw, gzip.GzipFile)
    with raw:
        n = 0
        try:
            while True:
                # (a small gzip file can hold a line of gigabytes: read it in bounds)
                line = raw.readline(MAX_LINE_BYTES + 1) if compressed else raw.readline()
                if not line:
                    break
                n += 1
                if len(line) > MAX_LINE_BYTES:
                    raise InputError(f"{path}:{n}: a line longer than {MAX_LINE_BYTES} "
                                     f"bytes once decompressed: not a capture line")
                yield n, line
        except (zlib.error, gzip.BadGzipFile) as e:  # damaged, not cut short
            raise InputError(f"{path}: compressed data is corrupt after line {n} "
                             f"({e})") from None
        except EOFError as e:
            print(f"kinspect {verb}: warning: {path}: compressed data ends early ({e}); "
                  f"the lines after {n} are lost", file=sys.stderr, flush=True)


def _replace_key(d: dict, old: str, new: str, value: Any) -> dict:
    """``d`` with key ``old`` replaced by ``new`` at the same position."""
    return {(new if k == old else k): (value if k == old else v) for k, v in d.items()}


_BAD = object()
_TORN = object()


def _json_line(line: bytes, path: str, where: dict, out: Any, verb: str) -> Any:
    """The JSON value of one batch-mode input line of file ``path``; ``where``: the
    keys saying where it is in an error line (``{"line": N}``, see
    :func:`_map_jsonl`). ``_BAD`` after writing an error line for it, or ``_TORN``
    after a warning for a torn last line (no newline, not the first line of its
    file: a capture still being written), as ``kinspect show`` skips it."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text ({e})"
    except ValueError as e:
        why = f"not JSON: {e}"
    except RecursionError:  # valid JSON, nested too deeply for json.loads
        why = "not JSON: values nested too deeply"
    if where["line"] > 1 and not line.endswith(b"\n"):
        print(f"kinspect {verb}: warning: {path}:{where['line']}: torn last line skipped "
              f"({len(line)} bytes)", file=sys.stderr, flush=True)
        return _TORN
    out.write(json.dumps({**where, "error": {"error": why}}) + "\n")
    return _BAD


_PASS, _DONE, _FAILED = range(3)
#: JSON separators of capture lines (no spaces), so encode gives back a capture's lines
_COMPACT = (",", ":")


def _map_jsonl(args: argparse.Namespace, verb: str, convert: Any) -> int:
    """Batch mode of decode and encode: one output line per input line, in order.
    ``convert(record)`` returns ``(output record, _PASS | _DONE | _FAILED)``: a
    line passed through unchanged (session lines and the like), a frame converted,
    or a frame that failed (its output carries the error). Blank lines are skipped;
    a line that is not JSON becomes an error line (``"line"``: its number in its
    file, and ``"file"`` when that is a rotated part, not ``args.jsonl``); a torn
    last line is skipped with a warning. Counts go to stderr.

    Returns:
        The exit status: 1 when a line failed or the input could not be read on,
        else 0.
    """
    out = _open_out(args.output)
    n = errors = 0
    failed: InputError | None = None
    try:
        for path, lineno, line in _lines(args.jsonl, verb):
            if line.isspace():
                continue
            # (a rotated part's line is named by its file too)
            where = {"line": lineno} if path == args.jsonl else {"file": path, "line": lineno}
            rec = _json_line(line, path, where, out, verb)
            if rec is _TORN:
                continue
            if rec is _BAD:
                errors += 1
                continue
            result, status = convert(rec)
            n += status != _PASS
            errors += status == _FAILED
            out.write(json.dumps(result, separators=_COMPACT) + "\n")
    except InputError as e:  # the input cannot be read on (the lines before are out)
        failed = e
    finally:
        if out is not sys.stdout:
            out.close()
        else:
            out.flush()
    print(f"kinspect {verb}: {n} frame{'' if n == 1 else 's'}, "
          f"{errors} error{'' if errors == 1 else 's'}", file=sys.stderr)
    if failed is not None:
        print(f"kinspect {verb}: {_error_text(failed)}", file=sys.stderr)
        return 1
    return 1 if errors else 0


def _decode_jsonl(codec: Any, args: argparse.Namespace) -> int:
    from ..capture import _b64decode
    from ..codec import DecodeError

    pending: dict[Any, dict[int, collections.deque]] = collections.defaultdict(dict)

    def convert(rec: Any) -> tuple[Any, int]:
        if not isinstance(rec, dict) or "frame" not in rec:
            return rec, _PASS  # session/conn lines and the like
        try:
            if type(rec["frame"]) is not str:  # (null, a number...: as kinspect show says)
                raise InputError("frame is not base64")
            frame = _b64decode(rec["frame"], validate=True)
            decoded = _decode_line(codec, rec, frame, pending, args.strict)
        except (DecodeError, InputError, ValueError, binascii.Error) as e:
            err = e.to_dict() if isinstance(e, DecodeError) else {"error": str(e)}
            return {**rec, "error": err}, _FAILED
        return _replace_key(rec, "frame", "decoded", decoded), _DONE

    return _map_jsonl(args, "decode", convert)


def _decode_line(codec: Any, rec: dict, frame: bytes, pending: dict,
                 strict: bool = False) -> dict:
    from ..codec import DecodeError

    conn = rec.get("conn")
    if "conn" in rec and type(conn) is not int:
        # as every capture reader (kinspect.capture): a connection is an integer
        raise InputError(f"'conn' must be an integer, got {json.dumps(conn)}")
    direction = rec.get("dir")
    if direction == "req":
        msg = codec.decode_request(frame, strict=strict)
        pending[conn].setdefault(msg.correlation_id, collections.deque()).append(
            (msg.api_key, msg.api_version))
        return message_to_dict(msg)
    if direction != "resp":
        raise InputError(f"'dir' must be 'req' or 'resp', got {direction!r}")
    corr = codec.response_correlation_id(frame)
    queue = pending[conn].get(corr)
    if queue:
        api_key, api_version = queue.popleft()
        if not queue:
            del pending[conn][corr]
    elif isinstance(rec.get("api_key"), int) and rec["api_key"] >= 0 and \
            isinstance(rec.get("api_version"), int):
        api_key, api_version = rec["api_key"], rec["api_version"]
    else:
        raise DecodeError(f"no request with correlation id {corr} on conn {rec.get('conn')!r} "
                          f"to type this response", offset=0, expected="a paired request")
    return message_to_dict(codec.decode_response(frame, api_key, api_version, strict=strict))


# ---------------------------------------------------------------------------
# encode


def run_encode(args: argparse.Namespace) -> int:
    from ..codec import EncodeError

    _check_batch(args, "encode")
    _check_output(args, [args.file])
    codec = make_codec(args)
    if args.jsonl:
        return _encode_jsonl(codec, args)
    try:
        try:
            if args.file == "-":
                doc = json.load(sys.stdin)
            else:
                with open(args.file, encoding="utf-8") as fh:
                    doc = json.load(fh)
        except RecursionError:  # valid JSON nested deeper than json.load follows
            raise ValueError("not JSON: values nested too deeply") from None
        except json.JSONDecodeError as e:  # (a ValueError: say what was expected)
            raise ValueError(f"not JSON ({e}): expected what 'kinspect decode' writes, "
                             f"a JSON object of one message") from None
        frame = encode_message(codec, message_from_dict(codec, doc))
    except OSError as e:  # "x.json: No such file or directory", as decode says it
        print(f"kinspect: {_error_text(e)}", file=sys.stderr)
        return 1
    except (EncodeError, ValueError) as e:
        print(f"kinspect: encode error: {e}", file=sys.stderr)
        return 1
    if args.size_prefix:
        frame = _SIZE.pack(len(frame)) + frame
    if args.hex or args.base64:
        text = frame.hex() if args.hex else base64.b64encode(frame).decode("ascii")
        out = _open_out(args.output)
        out.write(text + "\n")
        if out is not sys.stdout:
            out.close()
    else:
        out = _open_out(args.output, binary=True)
        out.write(frame)
        if out is not sys.stdout.buffer:
            out.close()
        else:
            out.flush()
    return 0


def _encode_jsonl(codec: Any, args: argparse.Namespace) -> int:
    from ..codec import EncodeError

    def convert(rec: Any) -> tuple[Any, int]:
        if not isinstance(rec, dict):
            return rec, _PASS
        if "decoded" not in rec:
            if "frame" in rec and "error" in rec:  # a frame that did not decode: as it was
                rec = {k: v for k, v in rec.items() if k != "error"}
            return rec, _PASS
        try:
            frame = encode_message(codec, message_from_dict(codec, rec["decoded"]))
        except (EncodeError, ValueError, TypeError) as e:
            return {**rec, "error": {"error": str(e), "path": getattr(e, "path", None)}}, _FAILED
        return _replace_key(rec, "decoded", "frame", base64.b64encode(frame).decode("ascii")), _DONE

    return _map_jsonl(args, "encode", convert)
