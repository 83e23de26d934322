"""The flow filter language, in the spirit of mitmproxy's: one language for the live
view, ``show``, replay and export.

Grammar (``!`` binds tightest, then ``&``, then ``|``; terms written side by side
are joined by ``&``)::

    expr   := or
    or     := and ("|" and)*
    and    := unary (["&"] unary)*
    unary  := "!" unary | "(" expr ")" | term
    term   := "~" NAME [ARG]

``ARG`` is a bare word (up to whitespace or one of ``( ) & | !``) or a quoted
string (``"..."`` or ``'...'``, backslash escapes). Only ``~dir`` takes ``|``
inside a bare word (``~dir req|resp``); elsewhere quote it (``~client "a|b"``).

Terms:

==================  ===============================================================
``~api X``          api name (case-insensitive: ``Produce``, ``produce``) or api key
                    (``~api 0``); also ``SaslToken``, ``Unpaired``, ``Malformed``;
                    the commands refuse a name no loaded spec defines
``~v N``            api version: ``9``, ``7-9``, ``7-``, ``0-3``, ``1,3,5-6``
                    (see *Numbers* below; a negative number is an error)
``~dir D``          direction ``req``, ``resp`` or ``req|resp`` (frame level: on a
                    flow, ``~dir resp`` means "has a response")
``~client RE``      regular expression searched in the client id
``~addr RE``        regular expression searched in the client or broker ``host:port``
``~conn N``         connection id: ``3``, ``1-3``, ``5-``, ``2,4``
``~corr N``         correlation id (an int32, may be negative): ``7``, ``-1``,
                    ``100-200``, ``-5--1``; flows without one (raw SASL tokens,
                    malformed requests: -1 there means "none") never match
``~topic NAME``     a topic named in the request or response (fields whose spec
                    ``entityType`` is ``topicName``, and topic ids resolved through
                    Metadata responses when a :class:`TopicIds` index is given)
``~err [N]``        a non-zero ``ErrorCode`` anywhere in the response (fields that
                    exist at the response's version); with ``N``,
                    that code: ``36``, ``-1`` (the code -1, UNKNOWN_SERVER_ERROR),
                    ``1-10``, ``30-``, ``-1,36``
``~undecoded``      flag ``undecoded``; likewise ``~mutated``, ``~rewritten``,
                    ``~sasl``, ``~closed``, ``~unpaired``, ``~noresp``
``~flag NAME``      any flow flag by name (e.g. ``decode-skipped``, ``redacted``)
``~all``            every flow
==================  ===============================================================

Numbers (``~v``, ``~conn``, ``~corr``, ``~err``): comma-separated numbers and
ranges, one grammar for all four. ``N`` is that number; ``A-B`` is A to B and ``A-``
is A and up, both inclusive. A leading ``-`` is always a sign: ``~corr -1`` is the
correlation id -1, ``~err -1-3`` the codes -1 to 3, ``~corr -5--1`` -5 to -1. There
is no "up to" form (``-3`` once meant "up to 3"): write the lower bound, ``~v 0-3``,
``~conn 1-3``. Api versions are never negative (a SASL token flow's -1 means "no
version", and ``~v`` matches none), so ``~v`` rejects negative numbers instead of
matching nothing.

Limits: ``!`` and ``(`` nest at most :data:`MAX_NESTING` deep, and a number has at
most :data:`MAX_DIGITS` digits.

Errors: :class:`FilterError` (a :class:`~kinspect.codec.KinspectError`) with the
``position`` (0-based character offset) of the problem.

Use::

    f = parse("~api Produce & !~err")
    [fl for fl in flows if f.matches(fl)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from .codec import KinspectError
from .flows import (
    CLOSED,
    MUTATED,
    NO_RESPONSE,
    REWRITTEN,
    SASL_TOKEN,
    TRAILING,
    UNDECODED,
    UNPAIRED,
    Flow,
    has_correlation_id,
)

__all__ = ["FilterError", "Filter", "parse", "TopicIds", "flow_topics", "error_codes",
           "TERMS", "MAX_NESTING", "MAX_DIGITS"]

#: deepest nesting of ``!`` and ``(`` (together) around a term: the parser and the
#: compiled filter recurse once per level, so a few thousand would exhaust the stack
MAX_NESTING = 100
#: most digits of a number in a filter: every number a term compares with (api keys
#: and versions, connection and correlation ids, error codes) fits in an int64
MAX_DIGITS = 19


class FilterError(KinspectError):
    """A filter expression that does not parse.

    Attributes:
        expr: the expression.
        position: 0-based character offset of the problem.
        reason: what is wrong.
    """

    def __init__(self, reason: str, expr: str, position: int):
        self.reason = reason
        self.expr = expr
        self.position = position
        super().__init__(f"bad filter at position {position}: {reason}\n  {expr}\n  "
                         + " " * position + "^")


# ---------------------------------------------------------------------------
# Flow facts used by terms
# ---------------------------------------------------------------------------

class TopicIds:
    """Topic id → name index learned from Metadata responses (Fetch and Produce
    since v13 name topics only by id). ``learn(flow)`` is cheap for other flows."""

    def __init__(self) -> None:
        self.names: dict[bytes, str] = {}

    def learn(self, flow: Flow) -> None:
        resp = flow.response_decoded
        if flow.api_key != 3 or resp is None or resp.body is None:
            return
        for t in resp.body.get("Topics") or ():
            tid, name = t.get("TopicId"), t.get("Name")
            if tid and name and any(tid):
                self.names[bytes(tid)] = name

    def learn_all(self, flows: Iterable[Flow]) -> "TopicIds":
        for f in flows:
            self.learn(f)
        return self

    def name(self, topic_id: bytes | None) -> str | None:
        return self.names.get(bytes(topic_id)) if topic_id else None


def _walk(value: Any, version: int | None = None) -> Iterator[tuple[Any, Any]]:
    """Yield ``(field spec, value)`` for every field of a decoded struct, depth first.

    With ``version`` (the version the struct was decoded at), only fields that exist
    at that version: a decoded struct holds every field of its spec, those absent at
    its version at their defaults, which are not on the wire and say nothing."""
    spec = getattr(value, "_spec", None)
    if spec is None:
        return
    stack = [value]
    while stack:
        s = stack.pop()
        for f in s._spec.fields:
            if version is not None and not f.versions.contains(version):
                continue
            v = getattr(s, f.name)
            yield f, v
            if v is not None and f.struct is not None:
                if f.is_array:
                    stack.extend(reversed(v))
                else:
                    stack.append(v)


def flow_topics(flow: Flow, topic_ids: TopicIds | None = None) -> set[str]:
    """Topic names a flow mentions: string fields whose spec ``entityType`` is
    ``topicName`` in the request and response bodies, plus ``TopicId`` uuids
    resolved through ``topic_ids``."""
    out: set[str] = set()
    for msg in (flow.request_decoded, flow.response_decoded):
        body = getattr(msg, "body", None)
        if body is None:
            continue
        for f, v in _walk(body, _body_version(msg)):
            if v is None:
                continue
            if f.entity_type == "topicName":
                if isinstance(v, str):
                    out.add(v)
                elif isinstance(v, list):
                    out.update(x for x in v if isinstance(x, str))
            elif topic_ids is not None and f.type == "uuid" and f.name == "TopicId":
                n = topic_ids.name(v)
                if n:
                    out.add(n)
    return out


def _body_version(msg: Any) -> int | None:
    """The version ``msg``'s body was decoded at (a response's ``body_version``: an
    ApiVersions error is answered as v0), or ``None`` when unknown."""
    v = getattr(msg, "body_version", None)
    if v is None:
        v = getattr(msg, "api_version", None)
    return v if isinstance(v, int) and v >= 0 else None


def error_codes(flow: Flow) -> list[int]:
    """Every ``ErrorCode`` value (int fields named ``ErrorCode``) in the decoded
    response, in walk order. Only fields that exist at the version the body was
    decoded at count: a field added in a later version (Metadata's top-level
    ``ErrorCode``, v13+) or dropped (FindCoordinator's, v0-3) holds its default,
    not a code the broker sent."""
    resp = flow.response_decoded
    body = getattr(resp, "body", None)
    if body is None:
        return []
    return [v for f, v in _walk(body, _body_version(resp))
            if f.name == "ErrorCode" and isinstance(v, int)]


# ---------------------------------------------------------------------------
# Filter objects
# ---------------------------------------------------------------------------

class Filter:
    """A compiled filter. ``matches(flow)`` for flow lists; ``matches_frame(flow, dir)``
    for one frame of a flow (``dir`` ``"req"``/``"resp"``; only ``~dir`` differs).

    ``topic_ids`` (a :class:`TopicIds`) lets ``~topic`` resolve topic ids; set it on
    the root filter or pass it to ``matches``. ``needs_decoded``: whether a term
    reads the decoded messages (``~topic``, ``~err``); the others read the flow's
    own attributes only.
    """

    text: str = ""
    topic_ids: TopicIds | None = None
    needs_decoded: bool = False

    def matches(self, flow: Flow, *, topic_ids: TopicIds | None = None) -> bool:
        return self._eval(flow, None, topic_ids or self.topic_ids)

    def matches_frame(self, flow: Flow, direction: str, *,
                      topic_ids: TopicIds | None = None) -> bool:
        return self._eval(flow, direction, topic_ids or self.topic_ids)

    def _eval(self, flow: Flow, direction: str | None, ids: TopicIds | None) -> bool:
        raise NotImplementedError

    def rejects_undecoded(self, flow: Flow, *, topic_ids: TopicIds | None = None) -> bool:
        """Whether ``flow`` fails the filter whatever its decoded messages hold: a
        part of an ``&`` that reads none of them fails (so that ``~api Fetch &
        ~topic t`` need not decode flows of other apis)."""
        return False

    def __call__(self, flow: Flow) -> bool:
        return self.matches(flow)

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


class _And(Filter):
    def __init__(self, parts: list[Filter]):
        self.parts = parts
        self.needs_decoded = any(p.needs_decoded for p in parts)

    def _eval(self, flow, direction, ids):
        return all(p._eval(flow, direction, ids) for p in self.parts)

    def rejects_undecoded(self, flow, *, topic_ids=None):
        ids = topic_ids or self.topic_ids
        return any(p.rejects_undecoded(flow, topic_ids=ids) if p.needs_decoded
                   else not p._eval(flow, None, ids) for p in self.parts)


class _Or(Filter):
    def __init__(self, parts: list[Filter]):
        self.parts = parts
        self.needs_decoded = any(p.needs_decoded for p in parts)

    def _eval(self, flow, direction, ids):
        return any(p._eval(flow, direction, ids) for p in self.parts)


class _Not(Filter):
    def __init__(self, inner: Filter):
        self.inner = inner
        self.needs_decoded = inner.needs_decoded

    def _eval(self, flow, direction, ids):
        return not self.inner._eval(flow, direction, ids)


class _Term(Filter):
    def __init__(self, fn: Callable[[Flow, str | None, TopicIds | None], bool],
                 needs_decoded: bool = False):
        self.fn = fn
        self.needs_decoded = needs_decoded

    def _eval(self, flow, direction, ids):
        return self.fn(flow, direction, ids)


# ---------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------

@dataclass
class _TermSpec:
    arg: str | None  # None: no argument; "required"; "optional"
    build: Callable[[str | None, Callable[[str], FilterError]], Callable]
    help: str
    needs_decoded: bool = False  # the term reads the decoded messages


_NUMBER_RANGE = re.compile(r"\s*(-?\d+)\s*(?:(-)\s*(-?\d+)?)?\s*")


def _number(text: str, err: Callable[[str], FilterError]) -> int:
    """The value of ``text``, an optional ``-`` and digits (as ``_NUMBER_RANGE``
    matched them).

    Raises:
        FilterError: more than :data:`MAX_DIGITS` digits (leading zeros count).
    """
    digits = len(text) - text.startswith("-")
    if digits > MAX_DIGITS:
        raise err(f"number too large: {digits} digits (at most {MAX_DIGITS})")
    return int(text)


def _ranges(arg: str, err: Callable[[str], FilterError], *,
            expected: str = "a number or range like 7, -1, 7-9 or 7-",
            minimum: tuple[int, str] | None = None) -> Callable[[int], bool]:
    """The argument of the numeric terms (``~v``, ``~conn``, ``~corr``, ``~err``):
    comma-separated numbers and ranges where a leading ``-`` is always a sign. A bare
    number, ``-1`` included, is that one number; ``A-B`` and ``A-`` are ranges
    (``-1-3``: -1 to 3, ``-5--2``: -5 to -2). There is no "up to" form, since ``-3``
    is the number -3: write the lower bound (``0-3``).

    ``minimum``: ``(lowest number the field can hold, why)``; a number below it is an
    error rather than a term that can never match (``~v -3``, once "up to 3").

    Raises:
        FilterError: a piece that is not a number or range, an empty range, a number
            below ``minimum`` or of more than :data:`MAX_DIGITS` digits.
    """
    parts = []
    for piece in arg.split(","):
        m = _NUMBER_RANGE.fullmatch(piece)
        if not m:
            raise err(f"expected {expected}, got {piece!r}")
        lo = _number(m.group(1), err)
        hi = lo if m.group(2) is None else (_number(m.group(3), err)
                                            if m.group(3) is not None else None)
        if minimum is not None and min(lo, lo if hi is None else hi) < minimum[0]:
            low, why = minimum
            hint = (f"; for 'up to {-lo}' write {low}-{-lo}"
                    if m.group(2) is None and -lo >= low else "")
            raise err(f"{why}: {piece.strip()!r} can never match ('-' before a number "
                      f"is a sign){hint}")
        if hi is not None and lo > hi:
            raise err(f"empty range {piece!r}")
        parts.append((lo, hi))

    def test(n: int) -> bool:
        return any(n >= lo and (hi is None or n <= hi) for lo, hi in parts)

    return test


def _regex(arg: str, err) -> re.Pattern:
    """Compile the argument of ``~client`` and ``~addr``.

    Raises:
        FilterError: a pattern :mod:`re` refuses, one with a repetition count too
            large for it (``a{4294967296}``), or groups nested deeper than its parser
            can recurse.
    """
    try:
        return re.compile(arg)
    except (re.error, OverflowError) as e:
        raise err(f"bad regular expression: {e}") from None
    except RecursionError:  # re's parser recurses for every nested group
        raise err("bad regular expression: groups nested too deeply") from None


def _t_api(arg, err):
    if re.fullmatch(r"-?\d+", arg):
        key = _number(arg, err)
        return lambda f, d, i: f.api_key == key
    name = arg.lower()
    for suffix in ("request", "response"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return lambda f, d, i: f.api_name.lower() == name


def _t_version(arg, err):
    test = _ranges(arg, err, minimum=(0, "api versions are never negative"))
    return lambda f, d, i: f.api_version >= 0 and test(f.api_version)


def _t_dir(arg, err):
    dirs = set(arg.lower().split("|"))
    bad = dirs - {"req", "resp"}
    if bad or not dirs:
        raise err(f"~dir takes req, resp or req|resp, got {arg!r}")

    def fn(f, d, i):
        if d is not None:
            return d in dirs
        # an empty request frame is still a request (a raw SASL token may be empty);
        # only an unpaired response has none
        return (("req" in dirs and (bool(f.request) or UNPAIRED not in f.flags))
                or ("resp" in dirs and f.response is not None))
    return fn


def _t_client(arg, err):
    rx = _regex(arg, err)
    return lambda f, d, i: f.client_id is not None and rx.search(f.client_id) is not None


def _t_addr(arg, err):
    rx = _regex(arg, err)
    return lambda f, d, i: bool(rx.search(f.client or "") or rx.search(f.upstream or ""))


def _t_conn(arg, err):
    test = _ranges(arg, err)
    return lambda f, d, i: test(f.conn)


def _t_corr(arg, err):
    test = _ranges(arg, err)
    return lambda f, d, i: has_correlation_id(f) and test(f.correlation_id)


def _t_topic(arg, err):
    return lambda f, d, i: arg in flow_topics(f, i)


def _t_err(arg, err):
    if arg is None:
        return lambda f, d, i: any(c != 0 for c in error_codes(f))
    test = _ranges(arg, err, expected="an error code or range like 36, -1, 1-10 or 30-")
    return lambda f, d, i: any(test(c) for c in error_codes(f))


def _flag(name):
    return lambda arg, err: (lambda f, d, i: name in f.flags)


def _t_flag(arg, err):
    return lambda f, d, i: arg in f.flags


def _t_all(arg, err):
    return lambda f, d, i: True


TERMS: dict[str, _TermSpec] = {
    "api": _TermSpec("required", _t_api, "api name or key"),
    "v": _TermSpec("required", _t_version, "api version or range"),
    "dir": _TermSpec("required", _t_dir, "req, resp or req|resp"),
    "client": _TermSpec("required", _t_client, "regex on the client id"),
    "addr": _TermSpec("required", _t_addr, "regex on client/broker host:port"),
    "conn": _TermSpec("required", _t_conn, "connection id or range"),
    "corr": _TermSpec("required", _t_corr, "correlation id or range"),
    "topic": _TermSpec("required", _t_topic, "topic name", needs_decoded=True),
    "err": _TermSpec("optional", _t_err,
                     "non-zero error code, or the given code(s): 36, -1, 1-10, 30-",
                     needs_decoded=True),
    "undecoded": _TermSpec(None, _flag(UNDECODED), "could not be decoded"),
    "trailing": _TermSpec(None, _flag(TRAILING), "bytes after a message (Kafka ignores them)"),
    "mutated": _TermSpec(None, _flag(MUTATED), "changed by a rule"),
    "rewritten": _TermSpec(None, _flag(REWRITTEN), "broker addresses rewritten"),
    "sasl": _TermSpec(None, _flag(SASL_TOKEN), "raw SASL token"),
    "closed": _TermSpec(None, _flag(CLOSED), "connection closed before the response"),
    "unpaired": _TermSpec(None, _flag(UNPAIRED), "response without request"),
    "noresp": _TermSpec(None, _flag(NO_RESPONSE), "request without response (acks=0)"),
    "flag": _TermSpec("required", _t_flag, "any flag by name"),
    "all": _TermSpec(None, _t_all, "every flow"),
}


# ---------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------

_OPS = "()&|!"
#: api names of flows that no spec names (raw SASL tokens, unpaired responses,
#: frames without a readable header)
_PSEUDO_APIS = ("SaslToken", "Unpaired", "Malformed")


class _Parser:
    def __init__(self, text: str, api_names: Iterable[str] | None = None):
        self.text = text
        self.pos = 0
        self.api_names = None if api_names is None else list(api_names)
        #: ``!`` and ``(`` around the term being parsed (see :data:`MAX_NESTING`)
        self.depth = 0

    def err(self, reason: str, pos: int | None = None) -> FilterError:
        return FilterError(reason, self.text, self.pos if pos is None else pos)

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self) -> Filter:
        if not self.text.strip():
            raise self.err("empty filter")
        f = self.parse_or()
        if self.peek():
            raise self.unexpected()
        return f

    def unexpected(self) -> FilterError:
        """The error for the character at ``pos``, where a term or expression ended
        and neither an operator, ``)`` nor the end follows."""
        c = self.text[self.pos]
        if c == ")":
            return self.err("unbalanced ')'")
        return self.err(f"unexpected {c!r}: expected '&', '|', ')' or the end after a term "
                        f"(an argument is one word: quote one holding spaces or any of "
                        f"( ) & | !)")

    def parse_or(self) -> Filter:
        parts = [self.parse_and()]
        while self.peek() == "|":
            self.pos += 1
            parts.append(self.parse_and())
        return parts[0] if len(parts) == 1 else _Or(parts)

    def parse_and(self) -> Filter:
        parts = [self.parse_unary()]
        while True:
            c = self.peek()
            if c == "&":
                self.pos += 1
                parts.append(self.parse_unary())
            elif c and c in "~!(":
                parts.append(self.parse_unary())  # implicit &
            else:
                break
        return parts[0] if len(parts) == 1 else _And(parts)

    def parse_unary(self) -> Filter:
        """``"!" unary | "(" expr ")" | term``.

        Raises:
            FilterError: also for ``!`` and ``(`` nested more than
                :data:`MAX_NESTING` deep.
        """
        c = self.peek()
        if c == "!" or c == "(":
            if self.depth >= MAX_NESTING:
                raise self.err(f"nested too deeply: at most {MAX_NESTING} '!' and '(' "
                               f"around a term")
            self.depth += 1
            f = self.parse_not() if c == "!" else self.parse_group()
            self.depth -= 1
            return f
        if c == "~":
            return self.parse_term()
        if not c:
            raise self.err("expression ends too early: expected a term like ~api Produce")
        if c in "&|)":
            raise self.err(f"expected a term like ~api Produce before {c!r}")
        raise self.err("expected a term starting with '~' (e.g. ~api Produce, ~topic orders)")

    def parse_not(self) -> Filter:
        self.pos += 1
        return _Not(self.parse_unary())

    def parse_group(self) -> Filter:
        start = self.pos
        self.pos += 1
        f = self.parse_or()
        if not self.peek():
            raise self.err(f"missing ')' for the '(' at position {start}")
        if self.peek() != ")":
            raise self.unexpected()
        self.pos += 1
        return f

    def parse_term(self) -> Filter:
        start = self.pos
        self.pos += 1
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*").match(self.text, self.pos)
        if not m:
            raise self.err("expected a term name after '~'")
        name = m.group(0)
        spec = TERMS.get(name.lower())
        if spec is None:
            raise self.err(f"unknown term ~{name} (known: "
                           + ", ".join("~" + t for t in TERMS) + ")", start)
        self.pos = m.end()
        arg = None
        arg_pos = self.pos
        if spec.arg is not None:
            self.skip_ws()
            arg_pos = self.pos
            arg = self.parse_arg(allow_bar=name.lower() == "dir")
            if arg is None and spec.arg == "required":
                raise self.err(f"~{name} needs an argument ({spec.help})")
        elif self.peek() and self.peek() not in _OPS + "~":
            raise self.err(f"~{name} takes no argument")

        def err(reason: str) -> FilterError:
            return FilterError(f"~{name}: {reason}", self.text, arg_pos)

        if name.lower() == "api" and self.api_names is not None:
            self.check_api_name(arg, err)
        f = _Term(spec.build(arg, err), spec.needs_decoded)
        return f

    def check_api_name(self, arg: str, err) -> None:
        """Refuse an api name that no spec defines (a typo would match nothing)."""
        name = arg.lower()
        for suffix in ("request", "response"):
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
        known = self.api_names + list(_PSEUDO_APIS)
        if (re.fullmatch(r"-?\d+|apikey\(-?\d+\)", name)
                or name in (k.lower() for k in known)):
            return
        import difflib

        close = difflib.get_close_matches(arg, known, n=3, cutoff=0.6)
        raise err(f"no api is named {arg!r}"
                  + (f" (did you mean {', '.join(close)}?)" if close else
                     " (kinspect specs lists the api names; ~api also takes a key: ~api 0)"))

    def parse_arg(self, allow_bar: bool) -> str | None:
        if self.pos >= len(self.text):
            return None
        c = self.text[self.pos]
        if c in "\"'":
            quote, start = c, self.pos
            self.pos += 1
            out = []
            while self.pos < len(self.text):
                ch = self.text[self.pos]
                if ch == "\\" and self.pos + 1 < len(self.text):
                    out.append(self.text[self.pos + 1])
                    self.pos += 2
                    continue
                if ch == quote:
                    self.pos += 1
                    return "".join(out)
                out.append(ch)
                self.pos += 1
            raise self.err("unterminated quoted string", start)
        if c == "~":
            # the next term (``~err~api 0``): known before scanning a word, which for
            # every ~err of ``~err~err~err...`` made parsing quadratic
            return None
        stops = "()&!" if allow_bar else _OPS
        start = self.pos
        while (self.pos < len(self.text) and not self.text[self.pos].isspace()
               and self.text[self.pos] not in stops):
            self.pos += 1
        if self.pos == start:
            return None
        return self.text[start:self.pos]


def parse(expr: str, api_names: Iterable[str] | None = None) -> Filter:
    """Compile a filter expression (see the module docstring).

    ``api_names``: the api names the codec knows (``"Metadata"``, ...); when given,
    ``~api`` refuses any other name (besides ``SaslToken``, ``Unpaired``,
    ``Malformed`` and ``ApiKey(N)``) instead of matching nothing.

    Raises:
        FilterError: with the position of the problem.
    """
    f = _Parser(expr, api_names).parse()
    f.text = expr
    return f
