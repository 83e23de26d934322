"""Pairing responses with requests on one connection (sans-io).

Kafka responses carry only the correlation id, so the api key and version of a
response come from the request it answers (protocol guide, "Requests and
Responses"); responses come back in request order. Special cases handled here:

* Produce with ``acks=0`` gets no response (GUIDE §2.7): such a request is
  returned with the ``no-response`` flag and not remembered;
* after a successful SaslHandshake v0, SASL tokens travel as raw size-prefixed
  frames with no Kafka header (KIP-43; v1 wraps them in SaslAuthenticate). Raw
  tokens are paired with the next response frame in order; raw mode ends with
  the first client frame that is a well-formed request header for a known api
  key and version.
"""

from __future__ import annotations

import struct
import weakref
from collections import deque
from typing import Any, Callable

from ..codec import Codec, DecodeError
from ..codec.compiler import FIXED, read_compact_prefix, read_uvarint
from ..flows import CLOSED, NO_RESPONSE, SASL_TOKEN, UNDECODED, UNPAIRED, Flow

PRODUCE = 0
SASL_HANDSHAKE = 17
_UNSET = object()
_HHI = struct.Struct(">hhi").unpack_from
_I = struct.Struct(">i").unpack_from
_H = struct.Struct(">h").unpack_from

# skip steps (see _skip_plan)
_FIXED, _STR16, _COMPACT, _BYTES32, _TAGS = range(5)
#: registry -> {api_version: skip plan to the Produce ``Acks`` field, or None}
_ACKS_PLANS: "weakref.WeakKeyDictionary[Any, dict[int, tuple | None]]" = \
    weakref.WeakKeyDictionary()


def _skip_plan(spec: Any, version: int, stop: str | None) -> list | None:
    """Steps that skip the top-level fields of ``spec`` at ``version`` before the
    field ``stop`` (or, with ``stop=None``, all of them and then the tag section of
    a flexible version). ``None`` when a field to skip is neither fixed-width nor a
    string/bytes (then the generic decoder must be used)."""
    flexible = spec.is_flexible(version)
    steps: list = []
    for f in spec.fields:
        if not f.versions.contains(version) or f.tagged_in(version):
            continue
        if f.name == stop:
            return steps
        compact = (f.flexible_versions.contains(version) if f.flexible_versions is not None
                   else flexible)
        if f.is_array:
            return None
        if f.type in FIXED and f.encoding_in(version) == "fixed":
            steps.append((_FIXED, FIXED[f.type][1]))
        elif f.type == "string":
            steps.append((_COMPACT if compact else _STR16, 0))
        elif f.type in ("bytes", "records"):
            steps.append((_COMPACT if compact else _BYTES32, 0))
        else:
            return None
    if stop is not None:
        return None
    if flexible:
        steps.append((_TAGS, 0))
    return steps


def _skip(plan: tuple, buf: bytes, pos: int = 0) -> int:
    """Run a skip plan over ``buf`` from ``pos``; the position reached.

    Raises:
        DecodeError, struct.error: truncated or malformed input.
    """
    for kind, n in plan:
        if kind == _FIXED:
            pos += n
        elif kind == _STR16:
            n = _H(buf, pos)[0]
            pos += 2 + (n if n > 0 else 0)
        elif kind == _COMPACT:  # a varint of 2^31 and up is a null, as Java reads it
            n, pos = read_compact_prefix(buf, pos)
            pos += n - 1 if n > 1 else 0
        elif kind == _BYTES32:
            n = _I(buf, pos)[0]
            pos += 4 + (n if n > 0 else 0)
        else:
            count, pos = read_uvarint(buf, pos)
            for _ in range(count):
                _, pos = read_uvarint(buf, pos)
                n, pos = read_uvarint(buf, pos)
                pos += n
    return pos


class FlowTracker:
    """Turns the frames of one connection into :class:`~kinspect.flows.Flow` objects.

    Args:
        codec: used for header versions and the Produce ``Acks`` field.
        conn: connection id; client, upstream: ``"host:port"`` strings.
        next_flow_id: callable returning a fresh flow id.
    """

    __slots__ = ("codec", "conn", "client", "upstream", "next_flow_id", "pending", "inflight",
                 "sasl_raw", "acks0", "acks_plans", "dups")

    def __init__(self, codec: Codec, conn: int, client: str, upstream: str,
                 next_flow_id: Callable[[], int]):
        self.codec = codec
        self.conn = conn
        self.client = client
        self.upstream = upstream
        self.next_flow_id = next_flow_id
        #: correlation id -> flow awaiting its response (the earliest, when a client
        #: reuses an id before the answer to it came: see ``dups``)
        self.pending: dict[int, Flow] = {}
        #: correlation id -> the later flows of that id awaiting their responses,
        #: in request order (answers come in request order: each pairs with the
        #: earliest request of its id)
        self.dups: dict[int, deque[Flow]] = {}
        #: flows awaiting a response, in request order (raw SASL tokens included)
        self.inflight: deque[Flow] = deque()
        self.sasl_raw = False
        #: recent acks=0 Produce requests by correlation id, to explain a stray answer
        self.acks0: dict[int, Flow] = {}
        #: Produce ``Acks`` skip plans by api version (shared per spec registry)
        self.acks_plans = self._plans()

    def _flow(self, api_key: int, api_version: int, corr: int, name: str, frame: bytes,
              now: int) -> Flow:
        return Flow(self.next_flow_id(), self.conn, self.client, self.upstream, api_key,
                    api_version, corr, name, frame, now)

    def request(self, frame: bytes, now: int) -> Flow:
        """Note a request frame. The returned flow has the ``no-response`` flag when
        no response will come (the caller then treats it as complete)."""
        if self.sasl_raw:  # any frame, even an empty one, may be a raw token
            if len(frame) >= 8 and self.codec.request_header_version(
                    *_HHI(frame, 0)[:2]) is not None:
                self.sasl_raw = False
            else:
                flow = self._flow(-1, -1, -1, "SaslToken", frame, now)
                flow.flags.add(SASL_TOKEN)
                self.inflight.append(flow)
                return flow
        if len(frame) < 8:
            flow = self._flow(-1, -1, -1, "Malformed", frame, now)
            flow.flags.update((UNDECODED, NO_RESPONSE))
            flow.error = f"request frame of {len(frame)} bytes is shorter than a header"
            return flow
        api_key, api_version, corr = _HHI(frame, 0)
        flow = Flow(self.next_flow_id(), self.conn, self.client, self.upstream, api_key,
                    api_version, corr, self.codec.api_name(api_key), frame, now)
        if api_key < 0:  # (an int16 on the wire; Kafka's keys are 0 and up)
            flow.flags.add(UNDECODED)
            flow.error = f"request: api key {api_key} is no Kafka api key (0 and up)"
        if api_key == PRODUCE and self.produce_acks(frame, api_version) == 0:
            flow.flags.add(NO_RESPONSE)
            if len(self.acks0) >= 64:
                self.acks0.pop(next(iter(self.acks0)))
            self.acks0[corr] = flow
            return flow
        if self.pending.setdefault(corr, flow) is not flow:  # the id is taken: after it
            self.dups.setdefault(corr, deque()).append(flow)
        self.inflight.append(flow)
        return flow

    def produce_acks(self, frame: bytes, api_version: int, start: int = 0) -> int | None:
        """The ``Acks`` of the Produce request frame at ``start`` in ``frame`` (4: a
        frame read with its size prefix, which need not be copied to be read), or
        ``None`` when the frame or the spec does not tell.

        On the forwarding path: the header and the fields before ``Acks`` are
        skipped with a plan computed once per version from the RequestHeader and
        ProduceRequest specs; the generic decoder is the fallback."""
        plan = self.acks_plans.get(api_version, _UNSET)
        if plan is _UNSET:
            plan = self._acks_plan(api_version)
        if plan is not None:
            try:
                pos = _skip(plan, frame, start)
            except (DecodeError, struct.error):
                return None
            return _H(frame, pos)[0] if pos + 2 <= len(frame) else None
        if start:
            frame = frame[start:]
        try:
            req = self.codec.decode_request(frame, body=False)
            return self.codec.request_codec(PRODUCE).peek_field(frame, api_version,
                                                                req.body_offset, "Acks")
        except (DecodeError, KeyError, LookupError, ValueError):
            return None
        except Exception:  # noqa: BLE001 - e.g. no Produce spec loaded: forward regardless
            return None

    def _plans(self) -> dict[int, tuple | None]:
        registry = self.codec.registry
        plans = _ACKS_PLANS.get(registry)
        if plans is None:
            plans = _ACKS_PLANS[registry] = {}
        return plans

    def _acks_plan(self, api_version: int) -> tuple | None:
        plans = self.acks_plans
        try:
            return plans[api_version]
        except KeyError:
            pass
        plan = None
        registry = self.codec.registry
        try:
            hv = self.codec.request_header_version(PRODUCE, api_version)
            spec = registry.request(PRODUCE)
            if hv is not None and spec is not None:
                head = _skip_plan(registry.header("RequestHeader").spec, hv, None)
                body = _skip_plan(spec, api_version, "Acks")
                if head is not None and body is not None:
                    plan = tuple(head + body)
        except Exception:  # noqa: BLE001 - no plan: the generic path decides
            plan = None
        if plan is not None or len(plans) < 256:  # (versions come from request headers)
            plans[api_version] = plan
        return plan

    def peek(self, corr: int) -> Flow | None:
        """The flow a response with correlation id ``corr`` would pair with (no
        state change): the raw SASL token in flight, else the pending request."""
        inflight = self.inflight
        if inflight and SASL_TOKEN in inflight[0].flags:
            return inflight[0]
        return self.pending.get(corr)

    def response(self, frame: bytes, now: int) -> Flow:
        """Pair a response frame with its request; an unmatched one gets a flow of
        its own flagged ``unpaired``."""
        inflight = self.inflight
        if inflight and SASL_TOKEN in inflight[0].flags:
            flow = inflight.popleft()
        else:
            corr = _I(frame, 0)[0] if len(frame) >= 4 else None
            flow = self.pending.pop(corr, None) if corr is not None else None
            if self.dups and flow is not None:
                later = self.dups.get(corr)
                if later:
                    self.pending[corr] = later.popleft()
                    if not later:
                        del self.dups[corr]
            if flow is None:
                flow = self._unpaired(corr, now)
                flow.response = frame
                flow.response_ns = now
                return flow
            if inflight and inflight[0] is flow:
                inflight.popleft()
            else:
                try:
                    inflight.remove(flow)
                except ValueError:
                    pass
        flow.response = frame
        flow.response_ns = now
        if (flow.api_key == SASL_HANDSHAKE and flow.api_version == 0 and len(frame) >= 6
                and _H(frame, 4)[0] == 0):
            self.sasl_raw = True
        return flow

    def _unpaired(self, corr: int | None, now: int) -> Flow:
        acks0 = self.acks0.pop(corr, None) if corr is not None else None
        if acks0 is not None:
            # A broker answered an acks=0 Produce (Kafka brokers do not). Keep the
            # api so the stray response decodes, and say what happened.
            flow = self._flow(acks0.api_key, acks0.api_version, corr, acks0.api_name, b"", now)
            flow.notes.append(f"response to acks=0 Produce flow #{acks0.id}, which expects none")
        else:
            flow = self._flow(-1, -1, corr if corr is not None else -1, "Unpaired", b"", now)
        flow.flags.add(UNPAIRED)
        return flow

    def close(self) -> list[Flow]:
        """End of connection: the flows still waiting, flagged ``closed``."""
        left = list(self.inflight)
        for flow in left:
            flow.flags.add(CLOSED)
        self.inflight.clear()
        self.pending.clear()
        self.dups.clear()
        return left
