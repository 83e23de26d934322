"""Flows: plain data describing what crossed the proxy.

A :class:`Flow` is one request frame and the response frame that answered it (or
none, for acks=0 Produce), with timestamps, the decoded views and flags. Flows
know nothing of sockets; the live view, captures and replay consume them.
"""

from __future__ import annotations

from typing import Any

#: flag names
UNDECODED = "undecoded"        # a frame kinspect could not decode (forwarded unchanged)
UNPAIRED = "unpaired"          # a response with no matching request
NO_RESPONSE = "no-response"    # a request that expects no response (acks=0 Produce)
REWRITTEN = "rewritten"        # broker addresses in the response were rewritten
SASL_TOKEN = "sasl"            # raw SASL token frames after SaslHandshake v0
MUTATED = "mutated"            # a rule changed the frame
SKIPPED = "decode-skipped"     # decoding was skipped under load (frames still forwarded)
CLOSED = "closed"              # the connection closed before the response came
REDACTED = "redacted"          # a capture line of the flow had secrets replaced (either way)
REDACTED_REQUEST = "redacted-request"  # ... the request's line (see kinspect.capture)
UNTIMED = "untimed"            # a capture line of the flow has no time (no latency then)
TRAILING = "trailing-bytes"    # a frame has bytes after its message, which Kafka's parsers
                               # do not read (decoded without them, forwarded with them)


class Flow:
    """One request/response exchange on one connection.

    Attributes:
        id: sequence number, unique within a proxy run (1-based).
        conn: connection id (1-based).
        client, upstream: ``"host:port"`` of the client and of the broker.
        api_key, api_version, correlation_id, client_id: from the request header
            (``api_key`` is -1 for raw SASL tokens).
        api_name: ``"Metadata"``, ``"ApiKey(99)"`` when no spec knows the key, or
            ``"SaslToken"``.
        request, response: frames without the size prefix, as received.
        response_sent: the bytes sent to the client when they differ from
            ``response`` (address rewriting), else ``None``.
        request_sent: likewise for a mutated request.
        request_ns, response_ns: ``time.time_ns()`` when each frame was complete.
        request_decoded, response_decoded: :class:`~kinspect.codec.Request` /
            :class:`~kinspect.codec.Response`, once decoded.
        error: the decode error text, if any.
        error_code: the response's top-level ErrorCode (``None`` if it has none).
        flags: set of flag names (module constants).
        notes: what the proxy noted on the flow, in order: the rules that changed
            a frame, why rules or an address rewrite were not applied (texts).
    """

    __slots__ = ("id", "conn", "client", "upstream", "api_key", "api_version", "correlation_id",
                 "client_id", "api_name", "request", "response", "request_sent", "response_sent",
                 "request_ns", "response_ns", "request_decoded", "response_decoded", "error",
                 "error_code", "flags", "notes")

    def __init__(self, id: int, conn: int, client: str, upstream: str, api_key: int,
                 api_version: int, correlation_id: int, api_name: str, request: bytes,
                 request_ns: int):
        self.id = id
        self.conn = conn
        self.client = client
        self.upstream = upstream
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id: str | None = None
        self.api_name = api_name
        self.request = request
        self.response: bytes | None = None
        self.request_sent: bytes | None = None
        self.response_sent: bytes | None = None
        self.request_ns = request_ns
        self.response_ns: int | None = None
        self.request_decoded: Any = None
        self.response_decoded: Any = None
        self.error: str | None = None
        self.error_code: int | None = None
        self.flags: set[str] = set()
        self.notes: list[str] = []

    @property
    def latency_ns(self) -> int | None:
        """Request to response; ``None`` without a response, without the request
        (``unpaired``: there is nothing to measure from), or when a capture line of
        the flow gave no time (``untimed``)."""
        if self.response_ns is None or UNPAIRED in self.flags or UNTIMED in self.flags:
            return None
        return self.response_ns - self.request_ns

    @property
    def complete(self) -> bool:
        return self.response is not None or NO_RESPONSE in self.flags or CLOSED in self.flags

    def copy(self) -> "Flow":
        """A shallow copy with its own ``flags`` and ``notes``."""
        other = Flow.__new__(Flow)
        for name in Flow.__slots__:
            setattr(other, name, getattr(self, name))
        other.flags = set(self.flags)
        other.notes = list(self.notes)
        return other

    def __repr__(self) -> str:
        return (f"Flow(#{self.id} conn={self.conn} {self.api_name} v{self.api_version} "
                f"corr={self.correlation_id} flags={sorted(self.flags)})")


def has_correlation_id(flow: Flow) -> bool:
    """Whether ``flow.correlation_id`` came from the wire. Raw SASL tokens and
    requests too short for a header (``api_key`` -1, not ``unpaired``) have none and
    hold -1 there, which a real id (an int32) may also be. (A header naming another
    negative api key, which no Kafka api has, is a header: its id is real.)"""
    return flow.api_key != -1 or UNPAIRED in flow.flags


def top_level_error_code(body: Any, version: int | None = None) -> int | None:
    """The ``ErrorCode`` field of a decoded response body, or ``None``.

    When the top level has none, the first non-zero ``ErrorCode`` one level down
    (per topic or per partition) is returned, else 0 if such fields exist.

    ``version``: the version the body was decoded at; fields that do not exist at it
    (held at their defaults, e.g. Metadata's top-level ``ErrorCode`` below v13) are
    left out. ``None``: every field of the spec.
    """
    if body is None:
        return None
    has_code, arrays = _error_code_plan(type(body), version)
    if has_code:
        return body.ErrorCode
    found = None
    level = [body]
    depth = 0
    while level and depth < 3:  # breadth first: the first non-zero code nearest the top
        nxt = []
        for s in level:
            for name in _error_code_plan(type(s), version)[1]:
                items = getattr(s, name)
                if items:
                    for x in items:
                        if _error_code_plan(type(x), version)[0]:
                            c = x.ErrorCode
                            if c:
                                return c
                            found = 0
                        nxt.append(x)
        level = nxt
        depth += 1
    return found


def _error_code_plan(cls: type, version: int | None = None) -> tuple[bool, tuple[str, ...]]:
    """(has an ``ErrorCode`` field, names of its arrays of structs) of a value class,
    at ``version`` (every field when ``None``), kept on the class itself (so it lives
    exactly as long as the class)."""
    plans = cls.__dict__.get("_error_code_plans")
    if plans is None:
        plans = {}
        try:
            cls._error_code_plans = plans
        except (AttributeError, TypeError):  # not a value class (a builtin type)
            pass
    plan = plans.get(version)
    if plan is None:
        spec = getattr(cls, "_spec", None)
        fields = [f for f in spec.fields if version is None or f.versions.contains(version)] \
            if spec is not None else []
        plan = (any(f.name == "ErrorCode" for f in fields),
                tuple(f.name for f in fields if f.is_array and f.struct is not None))
        plans[version] = plan
    return plan
