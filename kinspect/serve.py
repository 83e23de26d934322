"""Serve a capture as a broker: answer real clients with recorded responses.

:class:`CaptureBroker` listens on a loopback (or any) address and answers each
request with the recorded response of the best-matching recorded request
(:class:`ResponseIndex`), in this order of preference:

1. same api key and version, **equal body** (byte for byte after the header);
2. same api key and version, equal after ignoring volatile fields
   (:data:`kinspect.replay.DEFAULT_IGNORE`; ``records`` compared by their records'
   keys, values and headers, so a re-run producer's new timestamps do not matter);
3. same api key and version, the closest body (fewest differing fields).

Within a tier, a recorded response not served yet is preferred, in recorded order,
so successive Fetch requests get successive recorded Fetch responses; when all were
served, the last one is served again (after the request's ``MaxWaitMs`` or the
recorded latency, at most one second, so that clients polling past the end of the
recording do not spin).

JoinGroup and SyncGroup answers are sent after the time the recorded broker took
for them, at most five seconds: a group coordinator holds them until the rebalance
completes (``group.initial.rebalance.delay.ms``, 3 s by default), and a client
answered at once does its other work in another order than it did when recorded
(kafka-python, leading the group, computes the assignment before the Metadata
answer naming its topic came, and rejoins the group once it comes).

An answer is the one the recorded client got: the frame the proxy forwarded to it
(``frame_sent``) where the proxy changed it (a rule stripped or injected tagged
fields, say: a client that only worked with the change keeps working), else the
broker's; ``as_sent=False`` (``kinspect serve --as-received``) answers with the
broker's bytes as the proxy received them. Answers are re-encoded with the
client's correlation id and with every broker
address (Metadata, FindCoordinator, DescribeCluster, KIP-951 ``NodeEndpoints``;
found by :class:`~kinspect.proxy.rewrite.AddressRewriter`) pointing at this
listener. ApiVersions is answered at the client's version even when the recording
used another one (the recorded body re-encoded; a version no spec knows gets a v0
body with UNSUPPORTED_VERSION, as Kafka does, KIP-511). A request with no recorded
counterpart of its api and version gets the api's error response: the top-level
``ErrorCode`` set to UNSUPPORTED_VERSION (35) when the api was recorded at other
versions, else UNKNOWN_SERVER_ERROR (-1); per-topic/per-partition error codes
mirrored from the request where the api has no top-level one; a clean disconnect
where the response has no error field to carry it. Nothing a client sends stops
the server: errors are logged and end only that connection.

One exception: a group member's Heartbeat (api key 12, its body decoded) that the
capture holds no answer for is answered with success (``ErrorCode`` 0, tier
``"synthesized"``). A consumer heartbeats on a timer, so a replay slower than the
recording sends Heartbeats the recording never saw; the recorded JoinGroup and
SyncGroup answers already made it a stable member, and "still a member" is what
its broker answered then. ApiVersions keeps Heartbeat at the recorded broker's
version range (within the versions the specs know) while the capture holds none,
so that clients send it instead of failing on an api the broker seems to lack
(kafka-python then marks the coordinator dead and rejoins the group).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from .codec import Codec, DecodeError, EncodeError, KinspectError
from .codec.frames import DEFAULT_MAX_FRAME
from .codec.protocol import API_VERSIONS, Request, Response
from .codec.records import DEFAULT_MAX_DECOMPRESSED, DEFAULT_MAX_RECORDS, decode_records
from .codec.values import Struct
from .flows import SASL_TOKEN, UNPAIRED, Flow
from .proxy.rewrite import AddressRewriter
from .replay import (
    DEFAULT_IGNORE,
    IgnoreRules,
    diff_structs,
    error_name,
    expects_response,
)

log = logging.getLogger("kinspect.serve")

__all__ = ["CaptureBroker", "ResponseIndex", "Candidate", "ServeStats", "error_response",
           "UNSUPPORTED_VERSION", "UNKNOWN_SERVER_ERROR", "HEARTBEAT"]

UNSUPPORTED_VERSION = 35
UNKNOWN_SERVER_ERROR = -1
#: Api key of Heartbeat: answered with success when the capture holds no answer.
HEARTBEAT = 12
EXACT, NORMALIZED, CLOSEST, SYNTHESIZED = "exact", "normalized", "closest", "synthesized"
_SIZE = struct.Struct(">i")
_HHI = struct.Struct(">hhi").unpack_from
_MAX_REUSE_DELAY = 1.0
#: JoinGroup and SyncGroup: answered after the time the recorded broker took (its
#: rebalance delay), at most _MAX_GROUP_WAIT seconds
_GROUP_WAITS = frozenset({11, 14})
_MAX_GROUP_WAIT = 5.0


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------

class Candidate:
    """One recorded flow that can answer requests."""

    __slots__ = ("flow", "order", "body", "norm", "uses")

    def __init__(self, flow: Flow, order: int, body: bytes, norm: Any):
        self.flow = flow
        self.order = order
        self.body = body
        self.norm = norm
        self.uses = 0


class _RecordsBudget:
    """What decoding the records fields of one body may cost together: the records
    built and the bytes decompressed (the limits of one ``decode_records`` call).
    A request with many partitions cannot multiply them."""

    __slots__ = ("records", "decompressed")

    def __init__(self) -> None:
        self.records = DEFAULT_MAX_RECORDS
        self.decompressed = DEFAULT_MAX_DECOMPRESSED


def _normalize(s: Struct, api: str, rules: IgnoreRules, keypath: str = "",
               budget: _RecordsBudget | None = None) -> tuple:
    """A hashable form of a body without its volatile fields; records reduced to
    their records' ``(key, value, headers)`` while ``budget`` lasts (a new one per
    body), then kept as bytes."""
    if budget is None:
        budget = _RecordsBudget()
    out = []
    for f in s._spec.fields:
        kp = f"{keypath}.{f.name}" if keypath else f.name
        if rules.match(api, kp, f.entity_type):
            continue
        v = getattr(s, f.name)
        if v is None:
            out.append(None)
        elif f.struct is not None:
            if f.is_array:
                out.append(tuple(_normalize(x, api, rules, kp, budget) for x in v))
            else:
                out.append(_normalize(v, api, rules, kp, budget))
        elif f.element_type == "records" and not f.is_array:
            try:
                rs = decode_records(v, max_records=budget.records,
                                    max_decompressed=budget.decompressed)
                records = tuple((r.key, r.value, tuple(r.headers)) for r in rs.iter_records())
                budget.records = max(0, budget.records - len(records))
                budget.decompressed -= sum(b.uncompressed_size for b in rs.batches
                                           if b.compression != "none")
                out.append(records)
            except DecodeError:
                out.append(bytes(v))
        elif isinstance(v, list):
            out.append(tuple(bytes(x) if isinstance(x, bytearray) else x for x in v))
        else:
            out.append(bytes(v) if isinstance(v, bytearray) else v)
    return tuple(out)


class ResponseIndex:
    """Recorded flows indexed for answering: ``(api_key, api_version)`` → candidates.

    Only flows with a decoded request and a recorded response are candidates.
    """

    def __init__(self, codec: Codec, flows: Iterable[Flow], rules: IgnoreRules):
        self.codec = codec
        self.rules = rules
        self.by_api: dict[tuple[int, int], list[Candidate]] = {}
        self.exact: dict[tuple[int, int, bytes], list[Candidate]] = {}
        self.normalized: dict[tuple[int, int, Any], list[Candidate]] = {}
        self.versions: dict[int, set[int]] = {}
        self.api_versions: list[Candidate] = []
        n = 0
        for f in flows:
            if f.api_key < 0 or UNPAIRED in f.flags or SASL_TOKEN in f.flags:
                continue
            req = f.request_decoded
            if req is None or req.body is None or f.response is None:
                continue
            n += 1
            body = bytes(f.request[req.body_offset:])
            norm = _normalize(req.body, f.api_name, rules)
            c = Candidate(f, n, body, norm)
            key = (f.api_key, f.api_version)
            self.by_api.setdefault(key, []).append(c)
            self.exact.setdefault(key + (body,), []).append(c)
            self.normalized.setdefault(key + (norm,), []).append(c)
            self.versions.setdefault(f.api_key, set()).add(f.api_version)
            if f.api_key == API_VERSIONS:
                self.api_versions.append(c)

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_api.values())

    @staticmethod
    def _pick(cands: list[Candidate] | None) -> Candidate | None:
        if not cands:
            return None
        for c in cands:
            if c.uses == 0:
                return c
        return cands[-1]

    def match(self, req: Request, frame: bytes) -> tuple[Candidate | None, str | None]:
        """The candidate answering ``req`` and the tier (``"exact"``, ``"normalized"``,
        ``"closest"``), or ``(None, None)`` when no recorded request has its api and
        version. Does not mark the candidate used."""
        key = (req.api_key, req.api_version)
        all_c = self.by_api.get(key)
        if not all_c:
            return None, None
        exact = self.exact.get(key + (bytes(frame[req.body_offset:]),))
        norm_c = None
        if req.body is not None:
            norm_c = self.normalized.get(key + (_normalize(req.body, req.api_name, self.rules),))
        for cands, tier in ((exact, EXACT), (norm_c, NORMALIZED)):
            if cands and any(c.uses == 0 for c in cands):
                return self._pick(cands), tier
        for cands, tier in ((exact, EXACT), (norm_c, NORMALIZED)):
            if cands:
                return self._pick(cands), tier
        if req.body is None:
            return self._pick(all_c), CLOSEST
        best, best_score = None, None
        for c in all_c:
            try:
                d = diff_structs(c.flow.request_decoded.body, req.body, req.api_name, self.rules)
            except Exception:  # noqa: BLE001 - a candidate that cannot be compared is skipped
                continue
            score = (sum(1 for x in d if x.rule is None), c.uses > 0, c.order)
            if best_score is None or score < best_score:
                best, best_score = c, score
        return (best, CLOSEST) if best is not None else (self._pick(all_c), CLOSEST)


# ---------------------------------------------------------------------------
# Error responses
# ---------------------------------------------------------------------------

_PARTITION_NAMES = ("PartitionIndex", "Partition", "Index", "PartitionId")
_TOPIC_NAMES = ("Name", "Topic", "TopicName")


def _present(fields, version: int):
    return [f for f in fields if f.versions.contains(version) and not f.tagged_in(version)]


def _mirror(resp: Struct, req: Struct | None, code: int, version: int) -> int:
    """Fill ``resp`` with error ``code``: its ``ErrorCode`` if it has one, else
    elements mirrored from ``req``'s arrays with their key fields copied and their
    own error codes set. Returns how many error codes were set."""
    fields = _present(resp._spec.fields, version)
    names = {f.name: f for f in fields}
    ec = names.get("ErrorCode")
    req_fields = {} if req is None else {f.name: f for f in _present(req._spec.fields, version)
                                         if getattr(req, f.name) is not None}
    # copy key-like fields (topic names/ids, partition indexes) with equal or sibling names
    for f in fields:
        if f.struct is not None or f.is_array or not (
                f.map_key or f.entity_type is not None or f.name == "TopicId"
                or f.name in _PARTITION_NAMES or f.name in _TOPIC_NAMES):
            continue
        src = req_fields.get(f.name)
        if src is None:
            for group in (_PARTITION_NAMES, _TOPIC_NAMES):
                if f.name in group:
                    src = next((req_fields[n] for n in group if n in req_fields), None)
                    break
        if src is not None and src.type == f.type and not src.is_array:
            setattr(resp, f.name, getattr(req, src.name))
    if ec is not None and ec.type == "int16":
        resp.ErrorCode = code
        return 1
    if req is None:
        return 0
    set_count = 0
    resp_arrays = [f for f in fields if f.is_struct_array]
    req_arrays = [f for f in req_fields.values() if f.is_array]
    for rf in resp_arrays:
        qf = req_fields.get(rf.name) if rf.name in req_fields and req_fields[rf.name].is_array \
            else None
        if qf is None and len(resp_arrays) == 1 and len(req_arrays) == 1:
            qf = req_arrays[0]
        if qf is None:
            continue
        items = []
        for q in getattr(req, qf.name):
            item = rf.struct.cls()
            if isinstance(q, Struct):
                set_count += _mirror(item, q, code, version)
            else:  # a primitive array (PartitionIndexes, group ids): the element's key
                pf = next((g for g in _present(rf.struct.fields, version)
                           if g.type == qf.element_type and (
                               g.name in _PARTITION_NAMES
                               or (qf.entity_type is not None
                                   and g.entity_type == qf.entity_type))), None)
                if pf is None:
                    continue
                setattr(item, pf.name, q)
                set_count += _mirror(item, None, code, version)
            items.append(item)
        setattr(resp, rf.name, items)
    return set_count


def error_response(codec: Codec, req: Request, code: int) -> bytes | None:
    """The error response frame for ``req`` carrying ``code`` (see the module
    docstring), or ``None`` when the response has nowhere to put an error code (or no
    spec knows the api): the caller disconnects."""
    try:
        cls = codec.response_codec(req.api_key).cls
        hv = codec.response_header_version(req.api_key, req.api_version)
    except KinspectError:
        return None
    if hv is None:
        return None
    body = cls()
    if _mirror(body, req.body, code, req.api_version) == 0:
        return None
    resp = Response(req.api_key, req.api_version, req.correlation_id, hv, None, body, 0,
                    req.api_name, req.api_version)
    try:
        return codec.encode_response(resp)
    except EncodeError as e:
        log.warning("cannot encode an error response for %s v%d: %s", req.api_name,
                    req.api_version, e)
        return None


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------

@dataclass
class ServeStats:
    """Counts since start."""

    connections: int = 0
    requests: int = 0
    exact: int = 0
    normalized: int = 0
    closest: int = 0
    reused: int = 0
    api_versions_reencoded: int = 0
    synthesized: int = 0
    unmatched: int = 0
    disconnects: int = 0
    errors: int = 0
    started: float = field(default_factory=time.time)


class _Disconnect(Exception):
    pass


class CaptureBroker:
    """An asyncio server answering Kafka requests from a capture.

    Args:
        codec: decodes requests, re-encodes responses.
        flows: recorded flows (decoded), e.g. :func:`kinspect.replay.load_flows`.
        listen: ``(host, port)``; port 0 picks a free one.
        ignore: volatile-field patterns for the "equal after ignoring" tier.
        advertise_host: host written into broker addresses (default: the listen
            host; 127.0.0.1 for ``0.0.0.0`` or ``""``, ``::1`` for ``::``).
        max_frame: largest request accepted, bytes.
        as_sent: answer with the response as the proxy forwarded it to the recorded
            client (``Flow.response_sent``, when the proxy changed it); ``False``:
            as the broker sent it (``Flow.response``).

    ``await start()``, ``address``, ``await close()``; ``served`` lists what each
    request got (``{"conn", "api", "api_version", "correlation_id", "tier",
    "flow", "reused", "error"}``) and ``stats`` counts.
    """

    def __init__(self, codec: Codec, flows: list[Flow], listen: tuple[str, int] = ("127.0.0.1", 0),
                 *, ignore: Iterable[str] = DEFAULT_IGNORE, advertise_host: str | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, max_served_log: int = 100_000,
                 as_sent: bool = True):
        self.codec = codec
        self.as_sent = as_sent
        self.rules = IgnoreRules(ignore)
        self.index = ResponseIndex(codec, flows, self.rules)
        self.listen = listen
        self.advertise_host = advertise_host
        self.max_frame = max_frame
        self.rewriter = AddressRewriter(codec.registry)
        self.stats = ServeStats()
        self.served: list[dict[str, Any]] = []
        self.max_served_log = max_served_log
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._next_conn = 0
        self.port = 0

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` clients bootstrap from."""
        return self._advertised(), self.port

    def _advertised(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        h = self.listen[0]
        if h == "::":  # asyncio's IPv6 sockets are IPv6-only: 127.0.0.1 is not there
            return "::1"
        return "127.0.0.1" if h in ("", "0.0.0.0") else h

    async def start(self) -> "CaptureBroker":
        host, port = self.listen
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        for _ in range(5):
            ports = {s.getsockname()[1] for s in self._server.sockets}
            if port or len(ports) == 1:
                break
            # port 0 on several addresses (the wildcard "", a name with IPv4 and IPv6
            # addresses): each socket got its own port, and the one advertised may not
            # be the one a client's address family reaches: all of them on one port
            first = self._server.sockets[0].getsockname()[1]
            self._server.close()
            await self._server.wait_closed()
            try:
                self._server = await asyncio.start_server(self._handle, host, first,
                                                          reuse_address=True)
            except OSError:  # taken on another address meanwhile: try another port
                self._server = await asyncio.start_server(self._handle, host, 0,
                                                          reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("serving %d recorded responses on %s:%d", len(self.index), *self.address)
        return self

    async def __aenter__(self) -> "CaptureBroker":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening and close every client connection."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        await self._server.serve_forever()

    # -- connections -------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        self._writers.add(writer)
        self._next_conn += 1
        conn = self._next_conn
        self.stats.connections += 1
        peer = writer.get_extra_info("peername") or ("?", 0)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        log.debug("conn %d from %s:%s", conn, peer[0], peer[1])
        try:
            while True:
                head = await reader.readexactly(4)
                size = _SIZE.unpack(head)[0]
                if size < 0 or size > self.max_frame:
                    raise _Disconnect(f"request frame of {size} bytes")
                frame = await reader.readexactly(size)
                out = await self._answer(conn, frame)
                if out is not None:
                    writer.write(_SIZE.pack(len(out)) + out)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except _Disconnect as e:
            self.stats.disconnects += 1
            log.warning("conn %d (%s:%s): disconnecting: %s", conn, peer[0], peer[1], e)
        except Exception:  # noqa: BLE001 - never crash on a client
            self.stats.errors += 1
            log.exception("conn %d: unexpected error; connection closed", conn)
        finally:
            self._writers.discard(writer)
            self._conns.discard(task)
            writer.close()

    def _log(self, entry: dict[str, Any]) -> None:
        if len(self.served) < self.max_served_log:
            self.served.append(entry)

    async def _answer(self, conn: int, frame: bytes) -> bytes | None:
        """The response frame for one request frame, ``None`` for no response.

        Raises:
            _Disconnect: the request cannot be answered.
        """
        self.stats.requests += 1
        try:
            req = self.codec.decode_request(frame)
        except DecodeError as e:
            req = None
            try:
                req = self.codec.decode_request(frame, body=False)
            except DecodeError:
                pass
            if req is None and len(frame) >= 8 and _HHI(frame, 0)[0] == API_VERSIONS:
                # a version no spec knows (a newer client): answered v0 + UNSUPPORTED_VERSION
                _, version, corr = _HHI(frame, 0)
                req = Request(API_VERSIONS, version, corr, None, 2, None, None, len(frame),
                              "ApiVersions")
            if req is None:
                self._log({"conn": conn, "api": None, "tier": None, "error": str(e)})
                raise _Disconnect(f"undecodable request: {e}") from None
            log.warning("conn %d: %s v%d body not decodable (%s)", conn, req.api_name,
                        req.api_version, e.reason)
        entry = {"conn": conn, "api": req.api_name, "api_version": req.api_version,
                 "correlation_id": req.correlation_id, "tier": None, "flow": None,
                 "reused": False, "error": None}
        self._log(entry)
        if req.api_key == 0 and req.body is not None and req.body.get("Acks") == 0:
            needs_response = False
        else:
            needs_response = True
        cand, tier = self.index.match(req, frame)
        if cand is None and req.api_key == API_VERSIONS:
            out = self._api_versions(req)
            if out is not None:
                entry["tier"] = "api-versions"
                self.stats.api_versions_reencoded += 1
                return out
        if (cand is None and req.api_key == HEARTBEAT and req.body is not None
                and HEARTBEAT not in self.index.versions):
            out = self._heartbeat(req)
            if out is not None:
                entry["tier"] = SYNTHESIZED
                self.stats.synthesized += 1
                return out
        if cand is None:
            return self._unmatched(conn, req, entry, needs_response)
        entry["tier"], entry["flow"] = tier, cand.flow.id
        setattr(self.stats, tier, getattr(self.stats, tier) + 1)
        if tier == CLOSEST:
            log.info("conn %d: %s v%d answered with the closest recorded request (flow #%d)",
                     conn, req.api_name, req.api_version, cand.flow.id)
        reused = cand.uses > 0
        cand.uses += 1
        if reused:
            entry["reused"] = True
            self.stats.reused += 1
            delay = self._reuse_delay(req, cand.flow)
            if delay > 0:
                await asyncio.sleep(delay)
        elif req.api_key in _GROUP_WAITS and cand.flow.latency_ns is not None:
            await asyncio.sleep(min(max(0, cand.flow.latency_ns) / 1e9, _MAX_GROUP_WAIT))
        if not needs_response or not expects_response(cand.flow):
            return None
        return self._response_for(cand.flow, req)

    @staticmethod
    def _reuse_delay(req: Request, flow: Flow) -> float:
        wait = None
        if req.body is not None:
            mw = req.body.get("MaxWaitMs")
            if isinstance(mw, int) and mw > 0:
                wait = mw / 1000
        if wait is None and flow.latency_ns is not None:
            wait = max(0, flow.latency_ns) / 1e9
        return min(wait or 0.0, _MAX_REUSE_DELAY)

    def _map(self, node_id: int | None, host: str, port: int) -> tuple[str, int]:
        return self._advertised(), self.port

    def _response_for(self, flow: Flow, req: Request) -> bytes:
        """The recorded response re-encoded: correlation id and broker addresses."""
        raw = flow.response
        if self.as_sent and flow.response_sent is not None:
            raw = flow.response_sent
        try:
            resp = self.codec.decode_response(raw, flow.api_key, flow.api_version)
        except DecodeError as e:
            log.warning("recorded %s v%d response (flow #%d) not decodable (%s): sent with only "
                        "its correlation id changed", flow.api_name, flow.api_version, flow.id,
                        e.reason)
            return _SIZE.pack(req.correlation_id) + raw[4:]
        resp.correlation_id = req.correlation_id
        resp.header.CorrelationId = req.correlation_id
        if flow.api_key == API_VERSIONS and resp.body.get("ErrorCode") == 0:
            self._narrow_api_versions(resp.body)
        try:
            self.rewriter.rewrite(flow.api_key, flow.api_version, resp.body, self._map)
            return self.codec.encode_response(resp)
        except (KinspectError, ValueError) as e:
            log.warning("cannot re-encode the %s response of flow #%d (%s): sent with only its "
                        "correlation id changed", flow.api_name, flow.id, e)
            return _SIZE.pack(req.correlation_id) + raw[4:]

    def _recorded_answer(self, flow: Flow) -> Any:
        """The decoded response the recorded client got (see ``as_sent``), or ``None``
        when it does not decode."""
        if not self.as_sent or flow.response_sent is None:
            return flow.response_decoded
        try:
            return self.codec.decode_response(flow.response_sent, flow.api_key,
                                              flow.api_version)
        except DecodeError:
            return None

    def _api_versions(self, req: Request) -> bytes | None:
        """ApiVersions at a version the recording did not use: a recorded successful
        answer re-encoded at the client's version, or v0 + UNSUPPORTED_VERSION for a
        version no spec knows (the client retries lower, KIP-511)."""
        body = None
        for c in sorted(self.index.api_versions, key=lambda c: -c.flow.api_version):
            r = self._recorded_answer(c.flow)
            if r is not None and r.body is not None and r.body.get("ErrorCode") == 0:
                body = Struct.copy(r.body)
                break
        if body is None:
            return None
        self._narrow_api_versions(body)
        spec = self.codec.registry.response(API_VERSIONS)
        version = req.api_version
        if not spec.valid_versions.contains(version):
            body.ErrorCode = UNSUPPORTED_VERSION
            version = 0
        resp = Response(API_VERSIONS, req.api_version, req.correlation_id, 0, None, body, 0,
                        "ApiVersions", version)
        try:
            return self.codec.encode_response(resp)
        except EncodeError:
            # a field the target version lacks: keep only what every version has
            slim = type(body)(ErrorCode=body.ErrorCode, ApiKeys=body.ApiKeys)
            if version >= 1:
                slim.ThrottleTimeMs = body.ThrottleTimeMs
            resp.body = slim
            try:
                return self.codec.encode_response(resp)
            except EncodeError as e:
                log.warning("cannot encode ApiVersions v%d: %s", version, e)
                return None

    def _heartbeat(self, req: Request) -> bytes | None:
        """A successful Heartbeat response to ``req`` (every field at its default:
        ``ErrorCode`` 0, ``ThrottleTimeMs`` 0), or ``None`` when it cannot be
        encoded (the request is then unmatched)."""
        try:
            hv = self.codec.response_header_version(HEARTBEAT, req.api_version)
            if hv is None:
                return None
            body = self.codec.response_codec(HEARTBEAT).cls()
            resp = Response(HEARTBEAT, req.api_version, req.correlation_id, hv, None, body, 0,
                            req.api_name, req.api_version)
            return self.codec.encode_response(resp)
        except KinspectError as e:
            log.warning("cannot encode a Heartbeat v%d response: %s", req.api_version, e)
            return None

    def _narrow_api_versions(self, body: Any) -> None:
        """Advertise what the recording can answer: each api's highest version the
        highest recorded, apis never recorded left out (ApiVersions itself stays, and
        Heartbeat, answered without a recording), so a client negotiates versions that
        have answers. The lowest version stays the recorded broker's (or lower, to
        take every recorded version in): librdkafka tells what a broker can do by
        looking for old versions in its ranges (Fetch v4, Produce v3 for the v2
        message format; with Fetch offered at 11-11 only, librdkafka 2.0 sends no
        Fetch at all), and a version under the lowest recorded one is answered
        UNSUPPORTED_VERSION, which a client can read, where a range that left it
        out would refuse it before it is sent."""
        recorded = self.index.versions
        keep = []
        for entry in body.ApiKeys or []:
            versions = recorded.get(entry.ApiKey)
            if entry.ApiKey == API_VERSIONS:
                keep.append(entry)
            elif entry.ApiKey == HEARTBEAT and not versions:
                # the recorded broker's range, within the versions the specs know
                # (a version serve cannot decode would end the connection)
                known = self.codec.registry.request(HEARTBEAT).valid_versions
                low = max(entry.MinVersion, known.lowest)
                high = min(entry.MaxVersion, known.highest)
                if low <= high:
                    entry.MinVersion, entry.MaxVersion = low, high
                    keep.append(entry)
            elif versions:
                # (within the versions the specs know, as for Heartbeat)
                spec = self.codec.registry.request(entry.ApiKey)
                low = entry.MinVersion if spec is None else \
                    max(entry.MinVersion, spec.valid_versions.lowest)
                entry.MinVersion = min(low, min(versions))
                entry.MaxVersion = max(versions)
                keep.append(entry)
        body.ApiKeys = keep

    def _unmatched(self, conn: int, req: Request, entry: dict[str, Any],
                   needs_response: bool) -> bytes | None:
        self.stats.unmatched += 1
        other = sorted(self.index.versions.get(req.api_key, ()))
        code = UNSUPPORTED_VERSION if other else UNKNOWN_SERVER_ERROR
        why = (f"recorded only at version(s) {', '.join(map(str, other))}" if other
               else "never recorded")
        entry["tier"] = "unmatched"
        if not needs_response:
            log.warning("conn %d: %s v%d %s; it expects no response", conn, req.api_name,
                        req.api_version, why)
            entry["error"] = why
            return None
        out = error_response(self.codec, req, code)
        if out is None:
            entry["error"] = f"{why}; no error field: disconnected"
            raise _Disconnect(f"{req.api_name} v{req.api_version} {why}, and its response has "
                              f"no error field")
        entry["error"] = f"{why}; answered {error_name(code)}"
        log.warning("conn %d: %s v%d %s: answered %s", conn, req.api_name, req.api_version, why,
                    error_name(code))
        return out
