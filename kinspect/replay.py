"""Replay a capture against a broker and compare the answers with the recorded ones.

:class:`Replayer` re-opens every recorded client connection (one upstream
connection per recorded one, all to the one ``--upstream`` broker: Metadata-based
redirection to other brokers is not followed, a replay is single-broker) and sends
its requests in recorded order. Ordering follows the recording's causality: a
request is sent once every response that had arrived (on any connection) before it
was recorded has arrived again, so pipelined requests stay pipelined and a request
that waited for an answer waits again. Only responses to requests that come before
it in the capture count (so a wall clock stepped back between a request and its
response cannot make a request wait for itself, nor two connections wait for each
other), and a connection's requests go in capture order. ``speed`` additionally
spaces requests like the recording (``None``: as fast as the ordering allows).

Each request gets a fresh correlation id, mapped back to its recorded flow. Every
new response is compared with the recorded one through the codec
(:func:`diff_structs`): same api and version, error codes, and a structural diff of
the decoded bodies; arrays whose elements have a ``mapKey`` (topics by name, apis by
key...) are compared element by element with the same key, wherever it sits, and an
element only one side has is reported as missing or extra (elements left over on both
sides are then compared by position); tagged fields no spec knows are compared as
bytes, tag by tag; ``records`` fields are compared record by record. Differences
in volatile fields (broker clocks, node ids and addresses, member/producer/session
ids, epochs, topic ids...; :data:`DEFAULT_IGNORE`, extensible with
:class:`IgnoreRules` patterns) are kept apart as *ignored*.

Stateful flows: values the broker hands out and the client sends back (member id
from JoinGroup, generation id, producer id and epoch from InitProducerId, the
fetch session id from Fetch, topic ids; :data:`MAPPED_FIELDS`) are learned by
comparing recorded and new responses (in keyed arrays only between elements with the
same key: a topic id from the topic of the same name), and the recorded value is replaced by the new
one in later requests (through the codec; producer ids inside record batches are
patched and the batch CRC-32C recomputed). A request carrying such a value that was
handed out in the recording but not again in the replay is reported as *unmapped*.

Sources: Kafka protocol guide (correlation ids, request pipelining); KIP-98 record
batches; KIP-227 fetch sessions; KIP-394 member ids; KIP-516 topic ids.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import heapq
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import crc32c

from .codec import Codec, DecodeError, EncodeError, KinspectError
from .codec.records import decode_records
from .codec.spec import FieldSpec, uuid_to_text
from .codec.values import Struct
from .flows import CLOSED, NO_RESPONSE, REDACTED_REQUEST, SASL_TOKEN, UNPAIRED, Flow
from .show import error_name as _show_error_name

log = logging.getLogger("kinspect.replay")

__all__ = [
    "DEFAULT_IGNORE", "IGNORE_GROUPS", "MAPPED_FIELDS", "IgnoreRules", "Diff", "diff_structs",
    "IdMapper", "FlowResult", "ReplayReport", "Replayer", "load_flows", "error_name",
    "expects_response", "run_with_uvloop", "SINGLE_BROKER_NOTE", "UpstreamError",
]

#: Field-name patterns ignored when comparing (see :class:`IgnoreRules` for the syntax).
DEFAULT_IGNORE: tuple[str, ...] = (
    "ThrottleTimeMs",
    # broker clocks
    "*Timestamp", "*TimestampMs", "*TimeMs",
    # node ids and addresses (a replay talks to another broker)
    "entity:brokerId", "Host", "Port", "ClusterId",
    # handed out by the broker: group membership, producers, sessions, topics
    "MemberId", "Leader", "GenerationId", "GenerationIdOrMemberEpoch", "*Epoch",
    "ProducerId", "entity:producerId", "SessionId", "TopicId", "ClientHost",
    "ClientInstanceId", "SubscriptionId", "TokenId", "Hmac",
    # record batch header fields the broker or the producer id decide (KIP-98)
    "partition_leader_epoch", "producer_id", "producer_epoch", "crc", "crc_computed",
)

#: Named groups usable in ``--ignore``: ``--ignore offsets`` when replaying against
#: a broker that already holds data.
IGNORE_GROUPS: dict[str, tuple[str, ...]] = {
    "offsets": ("*Offset", "HighWatermark", "OffsetLag", "base_offset", "offset"),
    "records": ("Records",),
    "errors": ("ErrorMessage",),
}

#: Fields whose values the broker hands out and clients send back:
#: field name -> (kind, required type). Learned from responses, rewritten in requests.
MAPPED_FIELDS: dict[str, tuple[str, str]] = {
    "MemberId": ("member", "string"),
    "Leader": ("member", "string"),            # JoinGroup: the leader's member id
    "GenerationId": ("generation", "int32"),
    "GenerationIdOrMemberEpoch": ("generation", "int32"),
    "ProducerId": ("producer", "int64"),
    "ProducerEpoch": ("producer-epoch", "int16"),
    "SessionId": ("fetch-session", "int32"),   # KIP-227
    "TopicId": ("topic-id", "uuid"),           # KIP-516
}
#: Values that mean "none handed out yet" per kind (never mapped).
_NULLS: dict[str, tuple[Any, ...]] = {
    "member": ("", None),
    "generation": (-1, None),
    "producer": (-1, None),
    "producer-epoch": (-1, None),
    "fetch-session": (0, -1, None),
    "topic-id": (bytes(16), None),
}

SINGLE_BROKER_NOTE = ("single-broker replay: every recorded connection is re-opened to the "
                      "--upstream broker; Metadata-based redirection to other brokers is not "
                      "followed")

PRODUCE = 0


def error_name(code: int | None) -> str:
    """``"UNKNOWN_MEMBER_ID(25)"`` for a Kafka error code (names as in
    :func:`kinspect.show.error_name`)."""
    if code is None:
        return "none"
    return f"{'NONE' if code == 0 else _show_error_name(code)}({code})"


# ---------------------------------------------------------------------------
# Ignore rules
# ---------------------------------------------------------------------------

class IgnoreRules:
    """Which differences are volatile.

    Each pattern is one of:

    * a field name pattern (``fnmatch``, case-insensitive) matched against the
      field's name at any depth: ``ThrottleTimeMs``, ``*Epoch``;
    * a dotted path pattern matched against the index-free path from the top of
      the body, or a suffix of it: ``Responses.Partitions.HighWatermark``;
    * ``entity:TYPE``: every field with that ``entityType`` in the spec
      (``entity:brokerId``);
    * ``API:PATTERN``: one of the above limited to one api (``Fetch:HighWatermark``);
    * a group name from :data:`IGNORE_GROUPS` (``offsets``).

    Record batch fields inside ``records`` are named like
    :meth:`kinspect.codec.records.RecordBatch.to_dict` (``producer_id``).
    """

    def __init__(self, patterns: Iterable[str] = DEFAULT_IGNORE):
        self.patterns: list[str] = []
        self._rules: list[tuple[str | None, str, str, str]] = []  # (api, kind, pattern, text)
        for p in patterns:
            self.add(p)
        self._cache: dict[tuple[str, str, str | None], str | None] = {}

    def add(self, pattern: str) -> None:
        pattern = pattern.strip()
        if not pattern:
            return
        if pattern in IGNORE_GROUPS:
            self.patterns.append(pattern)
            for p in IGNORE_GROUPS[pattern]:
                self._add_one(p, text=f"{pattern}:{p}")
            return
        self.patterns.append(pattern)
        self._add_one(pattern, text=pattern)
        self._cache = {}

    def _add_one(self, pattern: str, text: str) -> None:
        api = None
        head, sep, rest = pattern.partition(":")
        if sep and head != "entity":
            api, pattern = head.lower(), rest
        if pattern.startswith("entity:"):
            self._rules.append((api, "entity", pattern[7:].lower(), text))
        elif "." in pattern:
            self._rules.append((api, "path", pattern.lower(), text))
        else:
            self._rules.append((api, "name", pattern.lower(), text))
        self._cache = {}

    def match(self, api: str, path: str, entity: str | None = None) -> str | None:
        """The pattern that makes ``path`` (index-free, dotted) of ``api`` volatile,
        or ``None``."""
        key = (api, path, entity)
        try:
            return self._cache[key]
        except KeyError:
            pass
        res = None
        api_l, path_l = api.lower(), path.lower()
        leaf = path_l.rpartition(".")[2]
        for r_api, kind, pat, text in self._rules:
            if r_api is not None and r_api != api_l:
                continue
            if kind == "name":
                ok = fnmatch.fnmatchcase(leaf, pat)
            elif kind == "path":
                ok = fnmatch.fnmatchcase(path_l, pat) or fnmatch.fnmatchcase(path_l, "*." + pat)
            else:
                ok = entity is not None and entity.lower() == pat
            if ok:
                res = text
                break
        self._cache[key] = res
        return res


# ---------------------------------------------------------------------------
# Structural diff
# ---------------------------------------------------------------------------

@dataclass
class Diff:
    """One difference between a recorded and a replayed value.

    Attributes:
        path: where, with list indices (``Topics[0].Partitions[1].ErrorCode``).
        kind: ``"error-code"``, ``"value"``, ``"length"``, ``"null"``, ``"missing"``,
            ``"extra"``, ``"records"``, ``"version"``, ``"unknown-tag"`` (a tagged field
            no spec knows, at ``..._unknown_tags.TAG``, its bytes in hex; ``None`` on
            the side that lacks it), ``"trailing"`` (the bytes after the body, in hex,
            ``None`` on a side without: see :mod:`kinspect.codec.protocol`).
        recorded, replayed: JSON-able values (bytes as base64, uuids as text).
        rule: the ignore pattern that makes it volatile, or ``None``.
        explanation: why it differs (filled for differences that are not ignored).
    """

    path: str
    kind: str
    recorded: Any
    replayed: Any
    rule: str | None = None
    explanation: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {"path": self.path, "kind": self.kind, "recorded": self.recorded,
             "replayed": self.replayed}
        if self.rule is not None:
            d["ignored_by"] = self.rule
        if self.explanation:
            d["explanation"] = self.explanation
        return d


def _plain(f: FieldSpec | None, v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, Struct):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(f, x) for x in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        if f is not None and f.element_type == "uuid":
            return uuid_to_text(bytes(v))
        return base64.b64encode(bytes(v)).decode("ascii")
    return v


def _map_key(x: Struct, keys: list[str]) -> Any:
    k = tuple(_key(getattr(x, n)) for n in keys)
    try:
        hash(k)
    except TypeError:
        return repr(k)
    return k


def _align(f: FieldSpec, a: list, b: list, leftovers: bool = True
           ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Pair the elements of two struct arrays.

    Where the element struct has ``mapKey`` fields (a topic by its name, an api by
    its key), elements with the same key on both sides are paired whatever their
    positions (the k-th of a repeated key with the k-th); the others are left over.
    With ``leftovers``, what is left over on both sides is then paired by position
    among itself (e.g. brokers whose node ids differ, a volatile key); without, it
    stays unpaired. Arrays without ``mapKey`` pair by position.

    Returns:
        ``(pairs, only_a, only_b)``: ``(index in a, index in b)`` in ``a``'s order,
        and the indices of the elements of ``a`` (missing from ``b``) and of ``b``
        (extra) that have no partner.
    """
    keys = [g.name for g in f.struct.fields if g.map_key] if f.struct is not None else []
    if not keys:
        n = min(len(a), len(b))
        return [(i, i) for i in range(n)], list(range(n, len(a))), list(range(n, len(b)))
    free: dict[Any, list[int]] = {}
    for j, x in enumerate(b):
        free.setdefault(_map_key(x, keys), []).append(j)
    pairs: list[tuple[int, int]] = []
    only_a: list[int] = []
    for i, x in enumerate(a):
        q = free.get(_map_key(x, keys))
        if q:
            pairs.append((i, q.pop(0)))
        else:
            only_a.append(i)
    only_b = sorted(j for q in free.values() for j in q)
    if leftovers:
        n = min(len(only_a), len(only_b))
        pairs.extend(zip(only_a[:n], only_b[:n]))
        only_a, only_b = only_a[n:], only_b[n:]
        pairs.sort()
    return pairs, only_a, only_b


def diff_structs(a: Struct, b: Struct, api: str, rules: IgnoreRules, out: list[Diff] | None = None,
                 path: str = "", keypath: str = "", inherited: str | None = None) -> list[Diff]:
    """Differences between two decoded bodies of the same message and version.

    Args:
        a, b: recorded and replayed values (:class:`~kinspect.codec.values.Struct`).
        api: api name (for ``API:`` ignore patterns).
        rules: volatile-field rules; each :class:`Diff` gets the matching pattern in
            ``rule`` (a struct's rule covers everything below it).

    Returns:
        ``out`` (a new list when ``None``), leaf differences appended in field order.
    """
    if out is None:
        out = []
    for f in a._spec.fields:
        va, vb = getattr(a, f.name), getattr(b, f.name, None)
        if va == vb:
            continue
        p = f"{path}.{f.name}" if path else f.name
        kp = f"{keypath}.{f.name}" if keypath else f.name
        rule = inherited or rules.match(api, kp, f.entity_type)
        if f.struct is not None:
            if va is None or vb is None:
                out.append(Diff(p, "null", _plain(f, va), _plain(f, vb), rule))
            elif f.is_array:
                pairs, only_a, only_b = _align(f, va, vb)
                for i, j in pairs:
                    diff_structs(va[i], vb[j], api, rules, out, f"{p}[{i}]", kp, rule)
                for i in only_a:
                    out.append(Diff(f"{p}[{i}]", "missing", _plain(f, va[i]), None, rule))
                for j in only_b:
                    out.append(Diff(f"{p}[{j}]", "extra", None, _plain(f, vb[j]), rule))
            else:
                diff_structs(va, vb, api, rules, out, p, kp, rule)
        elif f.element_type == "records" and not f.is_array:
            _diff_records(va, vb, api, rules, out, p, kp, rule)
        else:
            kind = "error-code" if f.name.endswith("ErrorCode") else "value"
            out.append(Diff(p, kind, _plain(f, va), _plain(f, vb), rule))
    ua, ub = getattr(a, "_unknown", None) or {}, getattr(b, "_unknown", None) or {}
    if ua != ub:  # tagged fields no spec knows: compared as bytes, tag by tag
        for t in sorted(set(ua) | set(ub)):
            x, y = ua.get(t), ub.get(t)
            if x != y:
                p = f"{path}._unknown_tags.{t}" if path else f"_unknown_tags.{t}"
                kp = f"{keypath}._unknown_tags" if keypath else "_unknown_tags"
                out.append(Diff(p, "unknown-tag", None if x is None else bytes(x).hex(),
                                None if y is None else bytes(y).hex(),
                                inherited or rules.match(api, kp)))
    return out


_BATCH_FIELDS = ("base_offset", "magic", "attributes", "compression", "timestamp_type",
                 "is_transactional", "is_control", "last_offset_delta", "base_timestamp",
                 "max_timestamp", "producer_id", "producer_epoch", "base_sequence",
                 "record_count", "partition_leader_epoch", "crc")


def _rec_value(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, list):
        return [[k, _rec_value(x)] for k, x in v]
    return v


def _diff_records(va: Any, vb: Any, api: str, rules: IgnoreRules, out: list[Diff], p: str,
                  kp: str, inherited: str | None) -> None:
    """Records fields: equal bytes, else batch by batch and record by record."""
    if va is None or vb is None:
        out.append(Diff(p, "null", _plain(None, va), _plain(None, vb), inherited))
        return
    try:
        ra, rb = decode_records(va), decode_records(vb)
    except DecodeError as e:
        out.append(Diff(p, "records", f"{len(va)} bytes", f"{len(vb)} bytes", inherited,
                        f"records not decodable: {e}"))
        return
    if len(ra.batches) != len(rb.batches):
        out.append(Diff(f"{p}.batches", "length", len(ra.batches), len(rb.batches),
                        inherited or rules.match(api, f"{kp}.batches")))
    for i, (x, y) in enumerate(zip(ra.batches, rb.batches)):
        bp, bkp = f"{p}.batches[{i}]", f"{kp}.batches"
        for name in _BATCH_FIELDS:
            u, w = getattr(x, name), getattr(y, name)
            if u != w:
                out.append(Diff(f"{bp}.{name}", "records", u, w,
                                inherited or rules.match(api, f"{bkp}.{name}")))
        if len(x.records) != len(y.records):
            out.append(Diff(f"{bp}.records", "length", len(x.records), len(y.records),
                            inherited or rules.match(api, f"{bkp}.records")))
        for k, (r, s) in enumerate(zip(x.records, y.records)):
            for name in ("offset", "timestamp", "key", "value", "headers"):
                u, w = getattr(r, name), getattr(s, name)
                if u != w:
                    out.append(Diff(f"{bp}.records[{k}].{name}", "records", _rec_value(u),
                                    _rec_value(w),
                                    inherited or rules.match(api, f"{bkp}.records.{name}")))
    if (ra.partial is None) != (rb.partial is None):
        out.append(Diff(f"{p}.partial", "records", ra.partial is not None, rb.partial is not None,
                        inherited or rules.match(api, f"{kp}.partial")))


# ---------------------------------------------------------------------------
# Ids handed out by the broker
# ---------------------------------------------------------------------------

_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


def _show(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)) and len(v) == 16:
        return uuid_to_text(bytes(v))
    return repr(v)


class IdMapper:
    """Recorded → replayed values of :data:`MAPPED_FIELDS`.

    ``learn`` walks a recorded and a new response side by side; ``rewrite`` replaces
    recorded values in a request body in place. Generation ids are scoped by the
    request's ``GroupId``, producer epochs by their producer id.
    """

    def __init__(self) -> None:
        self.mapping: dict[tuple[str, Any, Any], Any] = {}
        self.issued: dict[tuple[str, Any], int] = {}     # recorded value -> flow id
        self.seen_new: set[tuple[str, Any]] = set()
        self.learned: list[dict[str, Any]] = []

    @staticmethod
    def _scope(kind: str, struct_: Struct, group: Any) -> Any:
        if kind == "generation":
            return group
        if kind == "producer-epoch":
            return struct_.get("ProducerId")
        return None

    def _fields(self, s: Struct):
        for f in s._spec.fields:
            m = MAPPED_FIELDS.get(f.name)
            if m is not None and f.type == m[1]:
                yield f, m[0]

    def record_issued(self, body: Struct, flow_id: int) -> None:
        """Note every handed-out value in a recorded response."""
        for s, f, kind in self._walk(body):
            v = getattr(s, f.name)
            if v not in _NULLS[kind]:
                self.issued.setdefault((kind, _key(v)), flow_id)

    def _walk(self, body: Struct):
        stack = [body]
        while stack:
            s = stack.pop()
            for f in s._spec.fields:
                m = MAPPED_FIELDS.get(f.name)
                if m is not None and f.type == m[1]:
                    yield s, f, m[0]
                elif f.struct is not None:
                    v = getattr(s, f.name)
                    if v is None:
                        continue
                    if f.is_array:
                        stack.extend(v)
                    else:
                        stack.append(v)

    def learn(self, old: Struct, new: Struct, group: Any, flow_id: int) -> list[str]:
        """Learn mappings from a recorded (``old``) and a replayed (``new``) response
        body; return notes describing what was learned."""
        notes: list[str] = []
        for s, f, kind in self._walk(new):
            v = getattr(s, f.name)
            if v not in _NULLS[kind]:
                self.seen_new.add((kind, _key(v)))
        self._learn(old, new, group, flow_id, notes)
        return notes

    def _learn(self, a: Struct, b: Struct, group: Any, flow_id: int, notes: list[str]) -> None:
        for f in a._spec.fields:
            va, vb = getattr(a, f.name), getattr(b, f.name, None)
            m = MAPPED_FIELDS.get(f.name)
            if m is not None and f.type == m[1]:
                kind = m[0]
                if va in _NULLS[kind] or vb in _NULLS[kind] or va == vb:
                    continue
                key = (kind, self._scope(kind, a, group), _key(va))
                if self.mapping.get(key) != vb:
                    self.mapping[key] = vb
                    self.learned.append({"kind": kind, "recorded": _plain(f, va),
                                         "replayed": _plain(f, vb), "flow": flow_id})
                    notes.append(f"learned {kind} {_show(va)} -> {_show(vb)}")
            elif f.struct is not None and va is not None and vb is not None:
                if f.is_array:
                    # by key only: a topic id is learned from the same topic name,
                    # never from whatever topic happens to sit at the same position
                    pairs, _, _ = _align(f, va, vb, leftovers=False)
                    keys = [g.name for g in f.struct.fields if g.map_key]
                    for i, j in pairs:
                        if keys and all(getattr(va[i], k) in (None, "") for k in keys):
                            continue  # no name to tell it by (e.g. a null topic name)
                        self._learn(va[i], vb[j], group, flow_id, notes)
                else:
                    self._learn(va, vb, group, flow_id, notes)

    def lookup(self, kind: str, scope: Any, value: Any) -> tuple[bool, Any]:
        key = (kind, scope, _key(value))
        if key in self.mapping:
            return True, self.mapping[key]
        if scope is not None and kind != "generation":
            key = (kind, None, _key(value))
            if key in self.mapping:
                return True, self.mapping[key]
        return False, value

    def rewrite(self, body: Struct) -> tuple[list[str], list[dict[str, Any]]]:
        """Replace recorded values in a request body in place.

        Returns:
            ``(rewrites, unmapped)``: notes of each replaced value, and the values
            handed out in the recording that this replay has no new value for
            (``{"kind", "field", "value", "issued_by"}``).
        """
        rewrites: list[str] = []
        unmapped: list[dict[str, Any]] = []
        group = body.get("GroupId")
        self._rewrite(body, group, "", rewrites, unmapped)
        return rewrites, unmapped

    def _rewrite(self, s: Struct, group: Any, path: str, rewrites: list[str],
                 unmapped: list[dict[str, Any]]) -> None:
        old_pid = s.get("ProducerId")
        for f in s._spec.fields:
            v = getattr(s, f.name)
            p = f"{path}.{f.name}" if path else f.name
            m = MAPPED_FIELDS.get(f.name)
            if m is not None and f.type == m[1]:
                kind = m[0]
                if v in _NULLS[kind]:
                    continue
                scope = old_pid if kind == "producer-epoch" else (
                    group if kind == "generation" else None)
                found, new = self.lookup(kind, scope, v)
                if found:
                    setattr(s, f.name, new)
                    rewrites.append(f"{p}: {_show(v)} -> {_show(new)}")
                elif (kind, _key(v)) in self.issued and (kind, _key(v)) not in self.seen_new:
                    unmapped.append({"kind": kind, "field": p, "value": _plain(f, v),
                                     "issued_by": self.issued[(kind, _key(v))]})
            elif f.struct is not None and v is not None:
                items = v if f.is_array else [v]
                for i, item in enumerate(items):
                    self._rewrite(item, group, f"{p}[{i}]" if f.is_array else p, rewrites,
                                  unmapped)
            elif f.element_type == "records" and not f.is_array and v:
                new, notes = self.patch_records(v, p)
                if notes:
                    setattr(s, f.name, new)
                    rewrites.extend(notes)

    def patch_records(self, data: bytes, path: str) -> tuple[bytes, list[str]]:
        """Producer id/epoch of v2 record batches (KIP-98 header: producerId at byte
        43, producerEpoch at 51, CRC-32C at 17 over bytes 21..end), remapped."""
        out = bytearray(data)
        notes: list[str] = []
        pos, n, i = 0, len(data), 0
        while pos + 61 <= n:
            size = 12 + _I32.unpack_from(data, pos + 8)[0]
            if size < 61 or pos + size > n:
                break
            if data[pos + 16] == 2:
                pid = _I64.unpack_from(data, pos + 43)[0]
                epoch = _I16.unpack_from(data, pos + 51)[0]
                ok_p, new_pid = self.lookup("producer", None, pid) if pid >= 0 else (False, pid)
                ok_e, new_epoch = (self.lookup("producer-epoch", pid, epoch) if pid >= 0
                                   else (False, epoch))
                if ok_p or ok_e:
                    _I64.pack_into(out, pos + 43, new_pid)
                    _I16.pack_into(out, pos + 51, new_epoch)
                    _U32.pack_into(out, pos + 17, crc32c.crc32c(bytes(out[pos + 21:pos + size])))
                    notes.append(f"{path}.batches[{i}]: producer {pid}/{epoch} -> "
                                 f"{new_pid}/{new_epoch} (CRC recomputed)")
            pos += size
            i += 1
        return bytes(out), notes


def _key(v: Any) -> Any:
    return bytes(v) if isinstance(v, (bytearray, memoryview)) else v


# ---------------------------------------------------------------------------
# Capture reading
# ---------------------------------------------------------------------------

def load_flows(path: str, codec: Codec) -> list[Flow]:
    """The flows of a capture file, decoded (:func:`kinspect.capture.load_capture`).

    Raises:
        kinspect.capture.CaptureError: unreadable capture.
    """
    from .capture import load_capture

    return load_capture(path, codec).flows


def run_with_uvloop(coro: Any) -> Any:
    """Run a coroutine to completion on a new event loop, uvloop's when installed,
    without changing the process's event loop policy."""
    factory = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    runner_cls = getattr(asyncio, "Runner", None)
    if runner_cls is None:  # Python 3.10
        return asyncio.run(coro)
    with runner_cls(loop_factory=factory) as runner:
        return runner.run(coro)


def expects_response(flow: Flow) -> bool:
    """Whether the broker answers this request (not for acks=0 Produce, not for
    frames without a Kafka header)."""
    if flow.api_key < 0 or NO_RESPONSE in flow.flags:
        return False
    if flow.api_key == PRODUCE and flow.request_decoded is not None \
            and flow.request_decoded.body is not None:
        return flow.request_decoded.body.get("Acks") != 0
    return True


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------

MATCHED, DIFFERING, FAILED, SKIPPED = "matched", "differing", "failed", "skipped"
SASL_AUTHENTICATE = 36
_GROUP_APIS = {"JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "ConsumerGroupHeartbeat"}
_WRITE_APIS = {"Produce", "CreateTopics", "DeleteTopics", "CreatePartitions", "DeleteRecords",
               "OffsetCommit", "TxnOffsetCommit", "InitProducerId", "AddPartitionsToTxn",
               "EndTxn", "JoinGroup", "SyncGroup", "LeaveGroup", "AlterConfigs",
               "IncrementalAlterConfigs", "OffsetDelete"}
_HINTS = {
    "highwatermark": "the log held a different number of records when the broker answered",
    "laststableoffset": "the log held a different number of records when the broker answered",
    "logstartoffset": "the log start differs (retention, or a broker that already held data)",
    "baseoffset": "the record landed at another offset (the log held other records)",
    "offset": "the log holds other offsets than in the recording",
    "committedoffset": "the group's committed offset differs (earlier commits, in the replay "
                       "or before it)",
    "errormessage": "the error text that goes with the error code",
    "records": "the fetched log content differs",
    "batches": "the fetched log content differs",
    "value": "the record value differs",
    "key": "the record key differs",
}


@dataclass
class FlowResult:
    """What happened to one recorded flow in the replay.

    Attributes:
        flow: the recorded :class:`~kinspect.flows.Flow`.
        status: ``"matched"``, ``"differing"``, ``"failed"`` or ``"skipped"``.
        correlation_id: the replay's correlation id (``None`` if not sent).
        diffs: differences that count; ``ignored``: volatile ones.
        rewrites: recorded values replaced in the request (id mapping).
        unmapped: handed-out values the request carried without a replacement.
        learned: mappings learned from this flow's response.
        explanation: why the flow differs or failed (empty when matched).
        error: failure text.
        latency_ns: replay round trip.
    """

    flow: Flow
    status: str = SKIPPED
    correlation_id: int | None = None
    diffs: list[Diff] = field(default_factory=list)
    ignored: list[Diff] = field(default_factory=list)
    rewrites: list[str] = field(default_factory=list)
    unmapped: list[dict[str, Any]] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)
    explanation: str = ""
    error: str | None = None
    latency_ns: int | None = None
    response: Any = None

    def to_dict(self) -> dict[str, Any]:
        f = self.flow
        return {
            "flow": f.id, "conn": f.conn, "api": f.api_name, "api_key": f.api_key,
            "api_version": f.api_version, "recorded_correlation_id": f.correlation_id,
            "replay_correlation_id": self.correlation_id, "status": self.status,
            "explanation": self.explanation, "error": self.error,
            "recorded_error_code": f.error_code,
            "replay_error_code": _top_error(self.response),
            "diffs": [d.to_dict() for d in self.diffs],
            "ignored": [d.to_dict() for d in self.ignored],
            "request_rewrites": self.rewrites, "unmapped": self.unmapped,
            "learned": self.learned,
            "recorded_latency_ms": (None if f.latency_ns is None
                                    else round(f.latency_ns / 1e6, 3)),
            "replay_latency_ms": (None if self.latency_ns is None
                                  else round(self.latency_ns / 1e6, 3)),
        }


def _top_error(resp: Any) -> int | None:
    if resp is None or resp.body is None:
        return None
    from .flows import top_level_error_code

    return top_level_error_code(resp.body, resp.body_version)


@dataclass
class ReplayReport:
    """All results of a replay, in recorded flow order."""

    upstream: str
    results: list[FlowResult]
    ignore: list[str]
    notes: list[str]
    mappings: list[dict[str, Any]]
    elapsed_s: float = 0.0

    def counts(self) -> dict[str, int]:
        c = {MATCHED: 0, DIFFERING: 0, FAILED: 0, SKIPPED: 0}
        for r in self.results:
            c[r.status] += 1
        return c

    def by_status(self, status: str) -> list[FlowResult]:
        return [r for r in self.results if r.status == status]

    def to_dict(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "summary": self.counts(), "ignore": self.ignore,
                "notes": self.notes, "mappings": self.mappings,
                "elapsed_s": round(self.elapsed_s, 3),
                "flows": [r.to_dict() for r in self.results]}


# ---------------------------------------------------------------------------
# The replayer
# ---------------------------------------------------------------------------

_SIZE = struct.Struct(">i")


class UpstreamError(KinspectError):
    """The broker could not be reached at all: the first connection of a replay failed."""


class _Conn:
    def __init__(self, conn_id: int):
        self.id = conn_id
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[int, tuple[FlowResult, asyncio.Future]] = {}
        self.next_corr = 0
        self.dead: str | None = None
        self.read_task: asyncio.Task | None = None


class _DepCursor:
    """Which recorded responses one connection's requests wait for, request by request.

    A request waits for every response recorded (``response_ns``) before it, or before
    an earlier request of its connection (they are sent in order), whose own request
    comes strictly earlier in the capture (``seq``: position in capture order): every
    wait points to an earlier flow, so no request can wait for itself and no waits can
    form a cycle, whatever the timestamps say. A response passed over because its
    request comes later is kept for the first later request of the connection that
    comes after it.

    Args:
        by_resp: the flows whose responses are waited for, by ``(response_ns, seq)``.
        seq: ``flow id -> position`` in capture order.
    """

    def __init__(self, by_resp: list[Flow], seq: dict[int, int]):
        self.by_resp = by_resp
        self.seq = seq
        self.i = 0
        self.ts: int | None = None
        self.later: list[tuple[int, int, Flow]] = []   # heap: (seq, flow id, flow)

    def before(self, flow: Flow) -> list[Flow]:
        """The flows ``flow`` waits for, beyond those of the requests before it
        (``before`` is called for each request of the connection, in capture order)."""
        ts = flow.request_ns
        self.ts = ts if self.ts is None or ts > self.ts else self.ts
        me = self.seq[flow.id]
        out: list[Flow] = []
        later = self.later
        while later and later[0][0] < me:
            out.append(heapq.heappop(later)[2])
        lst, seq, i = self.by_resp, self.seq, self.i
        while i < len(lst) and lst[i].response_ns < self.ts:
            g = lst[i]
            if seq[g.id] < me:
                out.append(g)
            else:
                heapq.heappush(later, (seq[g.id], g.id, g))
            i += 1
        self.i = i
        return out


class Replayer:
    """Replays recorded flows against one broker.

    Args:
        codec: decodes and encodes frames.
        flows: recorded flows (decoded), in capture order (their order decides
            which responses a request waits for), e.g. :func:`load_flows`.
        upstream: ``(host, port)`` of the broker every connection goes to.
        speed: replay speed relative to the recording (2.0 = twice as fast);
            ``None`` = as fast as the recorded ordering allows.
        max_gap: longest pause between two consecutive requests, in seconds after
            ``speed`` (tcpreplay's ``--maxsleep``): a longer gap in the recording (an
            idle hour, a clock stepped forward) is shortened to it, and everything
            after it moves earlier by the difference; a note says how many were.
            ``None``: pauses as recorded.
        ignore: volatile-field patterns (:class:`IgnoreRules`); default
            :data:`DEFAULT_IGNORE`.
        select: predicate picking the flows to replay (others are skipped).
        timeout: seconds to wait for each response; a request that gets none in
            time fails, and its connection is closed (the flows still to come on it
            fail without being sent: a broker answers in order, so none could be).
        connect_timeout: seconds to reach the broker.
        progress: called with each finished :class:`FlowResult`.
        send_redacted: also replay flows whose request had secrets redacted in the
            capture (flag ``redacted-request``: passwords in configs, SCRAM
            credentials, token HMACs, SaslAuthenticate bytes), sending the redaction
            marker in their place. By default they are skipped with a reason: the
            marker would otherwise become, e.g., a real config value on the broker.
        check_upstream: open the first connection before anything else, and raise
            :class:`UpstreamError` (``cannot connect to HOST:PORT: ...``) from
            :meth:`run` if it cannot be made: a broker that cannot be reached is one
            error, not every flow failing. Without it, as after it, connection errors
            become failed flows.

    ``await replayer.run()`` returns a :class:`ReplayReport`; it never raises for
    broker behaviour (but see ``check_upstream``).
    """

    def __init__(self, codec: Codec, flows: list[Flow], upstream: tuple[str, int], *,
                 speed: float | None = 1.0, ignore: Iterable[str] | None = None,
                 select: Callable[[Flow], bool] | None = None, timeout: float = 30.0,
                 connect_timeout: float = 10.0,
                 progress: Callable[[FlowResult], None] | None = None,
                 send_redacted: bool = False, max_gap: float | None = None,
                 check_upstream: bool = False):
        if speed is not None and speed <= 0:
            raise ValueError("speed must be positive")
        if max_gap is not None and not max_gap >= 0:
            raise ValueError("max_gap must be 0 or more")
        self.codec = codec
        self.upstream = upstream
        self.speed = speed
        self.max_gap = max_gap
        self.rules = IgnoreRules(DEFAULT_IGNORE if ignore is None else ignore)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.progress = progress
        self.check_upstream = check_upstream
        self.mapper = IdMapper()
        self.results: dict[int, FlowResult] = {}
        self.notes: list[str] = [SINGLE_BROKER_NOTE]
        self._order: list[FlowResult] = []
        self.selected: list[Flow] = []
        ups = sorted({f.upstream for f in flows if f.upstream})
        if len(ups) > 1:
            self.notes.append(f"the recording talked to {len(ups)} brokers ({', '.join(ups)}); "
                              f"all are replayed against {upstream[0]}:{upstream[1]}")
        for f in flows:
            r = FlowResult(f)
            self.results[f.id] = r
            self._order.append(r)
            if f.response is not None and f.response_decoded is not None \
                    and f.response_decoded.body is not None:
                self.mapper.record_issued(f.response_decoded.body, f.id)
            if UNPAIRED in f.flags or not f.request:
                r.explanation = ("a response whose request is not in the capture (e.g. a "
                                 "later rotated part, or a capture started mid-connection): "
                                 "not replayed")
                continue
            if f.api_key < 0 or SASL_TOKEN in f.flags:
                r.explanation = "not a Kafka request (raw SASL token or malformed frame): " \
                                "not replayed"
                continue
            if select is not None and not select(f):
                r.explanation = "not selected by the filter"
                continue
            if REDACTED_REQUEST in f.flags and not send_redacted:
                r.explanation = (
                    "its credentials were redacted in the capture: not replayed (record with "
                    "--capture-secrets to replay authentication)"
                    if f.api_key == SASL_AUTHENTICATE else
                    "secret values in its request were redacted in the capture: not replayed, "
                    "so the broker is not sent the redaction marker as a value (record with "
                    "--capture-secrets, or replay with --send-redacted)")
                continue
            self.selected.append(f)
        self._done: dict[int, asyncio.Event] = {}
        self._first_unexplained: FlowResult | None = None
        self._subject_cache: dict[int, set] = {}
        # capture order; each connection's flows in it; responses waited for by time
        self._seq = {f.id: n for n, f in enumerate(self.selected)}
        self._conns: dict[int, list[Flow]] = {}
        for f in self.selected:
            self._conns.setdefault(f.conn, []).append(f)
        self._by_resp = sorted((f for f in self.selected
                                if f.response_ns is not None and expects_response(f)),
                               key=lambda f: (f.response_ns, self._seq[f.id]))

    def dependencies(self) -> dict[int, list[int]]:
        """``flow id -> ids of the flows whose responses it waits for`` before it is
        sent, for every selected flow (those an earlier request of its connection
        already waited for are not repeated). Every id is of a flow that comes
        earlier in ``flows``."""
        out: dict[int, list[int]] = {}
        for lst in self._conns.values():
            cur = _DepCursor(self._by_resp, self._seq)
            for f in lst:
                out[f.id] = [g.id for g in cur.before(f)]
        return out

    def schedule(self) -> dict[int, float]:
        """``request_ns -> seconds after the start`` at which the selected requests
        recorded then are sent (``speed`` and ``max_gap`` applied; empty without a
        ``speed``). Shortened gaps are noted in :attr:`notes` (once)."""
        if self.speed is None:
            return {}
        out: dict[int, float] = {}
        at, prev, shortened = 0.0, None, 0
        for t in sorted({f.request_ns for f in self.selected}):
            if prev is not None:
                gap = (t - prev) / 1e9 / self.speed
                if self.max_gap is not None and gap > self.max_gap:
                    gap = self.max_gap
                    shortened += 1
                at += gap
            out[t] = at
            prev = t
        if shortened:
            note = (f"{shortened} recorded pause(s) between requests longer than "
                    f"{self.max_gap:g} s shortened to {self.max_gap:g} s (max gap)")
            if note not in self.notes:
                self.notes.append(note)
        return out

    # -- main ------------------------------------------------------------------
    async def run(self) -> ReplayReport:
        t_start = time.monotonic()
        loop = asyncio.get_running_loop()
        self._done = {f.id: asyncio.Event() for f in self.selected}
        self._at = self.schedule()
        self._wall0 = loop.time()
        opened: dict[int, _Conn] = {}
        if self.check_upstream and self.selected:
            # (the first request goes out at once anyway: its connection is opened first)
            first = opened[self.selected[0].conn] = _Conn(self.selected[0].conn)
            await self._connect(first)
            if first.dead is not None:
                raise UpstreamError(first.dead)
        await asyncio.gather(*(self._run_conn(cid, lst, opened.get(cid))
                               for cid, lst in self._conns.items()))
        for r in self._order:
            if r.status == SKIPPED and not r.explanation:
                r.explanation = "not replayed"
        return ReplayReport(f"{self.upstream[0]}:{self.upstream[1]}", self._order,
                            list(self.rules.patterns), self.notes, self.mapper.learned,
                            time.monotonic() - t_start)

    async def _wait_deps(self, flow: Flow, cur: _DepCursor) -> None:
        """Wait for the replayed responses ``flow`` depends on (causal order,
        :class:`_DepCursor`)."""
        for g in cur.before(flow):
            await self._done[g.id].wait()

    async def _run_conn(self, conn_id: int, flows: list[Flow], conn: _Conn | None = None
                        ) -> None:
        """Replay one recorded connection's ``flows`` (on ``conn`` when it is already
        open, else on a connection opened before its first request)."""
        conn = conn or _Conn(conn_id)
        cur = _DepCursor(self._by_resp, self._seq)
        waiters: list[asyncio.Task] = []
        loop = asyncio.get_running_loop()
        try:
            for f in flows:
                if self.speed is not None:
                    delay = self._wall0 + self._at[f.request_ns] - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await self._wait_deps(f, cur)
                res = self.results[f.id]
                if conn.writer is None and conn.dead is None:
                    await self._connect(conn)
                if conn.dead is not None:
                    self._finish(res, FAILED, error=conn.dead)
                    continue
                try:
                    frame = self._prepare(conn, res)
                except KinspectError as e:
                    self._finish(res, FAILED, error=f"cannot rebuild the request: {e}")
                    continue
                sent_ns = time.monotonic_ns()
                if expects_response(f):
                    fut = loop.create_future()
                    conn.pending[res.correlation_id] = (res, fut)
                    conn.writer.write(_SIZE.pack(len(frame)) + frame)
                    waiters.append(asyncio.create_task(self._await_response(conn, res, fut,
                                                                            sent_ns)))
                else:
                    conn.writer.write(_SIZE.pack(len(frame)) + frame)
                    self._finish(res, MATCHED if f.response is None else DIFFERING,
                                 explanation="" if f.response is None else
                                 "sent without expecting a response, but one was recorded")
                try:
                    await conn.writer.drain()
                except (ConnectionError, OSError) as e:
                    self._kill(conn, f"connection lost while sending: {e}")
            if waiters:
                await asyncio.gather(*waiters)
        finally:
            for t in waiters:
                if not t.done():
                    t.cancel()
            for f in flows:
                r = self.results[f.id]
                if not self._done[f.id].is_set():
                    self._finish(r, FAILED, error=r.error or "not replayed (connection ended)")
            if conn.read_task is not None:
                conn.read_task.cancel()
            if conn.writer is not None:
                conn.writer.close()
                try:
                    await conn.writer.wait_closed()
                except (ConnectionError, OSError):
                    pass

    async def _connect(self, conn: _Conn) -> None:
        host, port = self.upstream
        try:
            conn.reader, conn.writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            conn.dead = f"cannot connect to {host}:{port}: {e or type(e).__name__}"
            return
        conn.read_task = asyncio.create_task(self._read_loop(conn))

    async def _read_loop(self, conn: _Conn) -> None:
        reader = conn.reader
        try:
            while True:
                head = await reader.readexactly(4)
                size = _SIZE.unpack(head)[0]
                if size < 4:
                    raise ConnectionError(f"broker sent a frame of {size} bytes")
                frame = await reader.readexactly(size)
                corr = _I32.unpack_from(frame, 0)[0]
                entry = conn.pending.pop(corr, None)
                if entry is None:
                    log.warning("conn %d: response with unknown correlation id %d", conn.id, corr)
                    continue
                if not entry[1].done():
                    entry[1].set_result((frame, time.monotonic_ns()))
        except asyncio.IncompleteReadError:
            self._kill(conn, "the broker closed the connection")
        except (ConnectionError, OSError) as e:
            self._kill(conn, f"connection error: {e}")

    def _kill(self, conn: _Conn, reason: str) -> None:
        if conn.dead is None:
            conn.dead = reason
        for _res, fut in list(conn.pending.values()):
            if not fut.done():
                fut.set_exception(ConnectionError(reason))
        conn.pending.clear()

    def _prepare(self, conn: _Conn, res: FlowResult) -> bytes:
        """The request frame to send: recorded bytes (as forwarded), ids remapped
        through the codec, a fresh correlation id."""
        f = res.flow
        conn.next_corr += 1
        corr = res.correlation_id = conn.next_corr
        raw = f.request_sent or f.request
        try:
            req = self.codec.decode_request(raw)
        except DecodeError as e:
            res.rewrites.append(f"request not decodable ({e.reason}); sent as recorded")
            return raw[:4] + _I32.pack(corr) + raw[8:]
        rewrites, unmapped = self.mapper.rewrite(req.body)
        res.rewrites.extend(rewrites)
        res.unmapped.extend(unmapped)
        if not rewrites:
            return raw[:4] + _I32.pack(corr) + raw[8:]
        req.header.CorrelationId = corr
        req.correlation_id = corr
        try:
            return self.codec.encode_request(req)
        except EncodeError as e:
            raise KinspectError(f"re-encoding {f.api_name} v{f.api_version}: {e}") from e

    async def _await_response(self, conn: _Conn, res: FlowResult, fut: asyncio.Future,
                              sent_ns: int) -> None:
        f = res.flow
        try:
            frame, got_ns = await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            conn.pending.pop(res.correlation_id, None)
            self._finish(res, FAILED, error=f"no response within {self.timeout:g} s")
            # a broker answers a connection's requests in order (protocol guide), so
            # nothing later on it can come first: close it, as a client's request
            # timeout does, rather than wait out the timeout once per later request
            self._kill(conn, f"connection closed after flow #{f.id} got no response within "
                             f"{self.timeout:g} s")
            if conn.writer is not None:
                conn.writer.close()
            return
        except ConnectionError as e:
            self._finish(res, FAILED, error=str(e))
            return
        res.latency_ns = got_ns - sent_ns
        try:
            self._compare(res, frame)
        except Exception as e:  # noqa: BLE001 - one flow's trouble must not stop the replay
            log.exception("flow %d: comparison failed", f.id)
            self._finish(res, FAILED, error=f"comparison failed: {type(e).__name__}: {e}")

    def _compare(self, res: FlowResult, frame: bytes) -> None:
        f = res.flow
        try:
            new = self.codec.decode_response(frame, f.api_key, f.api_version)
        except DecodeError as e:
            self._finish(res, FAILED, error=f"new response not decodable: {e}")
            return
        res.response = new
        old = f.response_decoded
        if f.response is None:
            self._finish(res, SKIPPED, explanation="the recording has no response to compare "
                         "with" + (" (the connection closed first)" if CLOSED in f.flags else ""))
            return
        if old is None or old.body is None:
            self._finish(res, DIFFERING, explanation="the recorded response could not be decoded"
                         + (f" ({f.error})" if f.error else "") + ": nothing to compare with")
            return
        diffs: list[Diff] = []
        if old.body_version != new.body_version:
            diffs.append(Diff("(body version)", "version", old.body_version, new.body_version))
            res.diffs = diffs
            self._finish(res, DIFFERING, explanation=self._explain(res))
            return
        group = None
        if f.request_decoded is not None and f.request_decoded.body is not None:
            group = f.request_decoded.body.get("GroupId")
        res.learned = self.mapper.learn(old.body, new.body, group, f.id)
        diff_structs(old.body, new.body, f.api_name, self.rules, diffs)
        if old.trailing != new.trailing:  # (bytes after the body: the broker wrote them)
            diffs.append(Diff("(bytes after the body)", "trailing", old.trailing.hex() or None,
                              new.trailing.hex() or None))
        res.ignored = [d for d in diffs if d.rule is not None]
        res.diffs = [d for d in diffs if d.rule is None]
        if res.diffs:
            self._finish(res, DIFFERING, explanation=self._explain(res))
        else:
            self._finish(res, MATCHED)

    def _finish(self, res: FlowResult, status: str, *, error: str | None = None,
                explanation: str = "") -> None:
        ev = self._done.get(res.flow.id)
        if ev is not None and ev.is_set():
            return
        res.status = status
        if error is not None:
            res.error = error
            explanation = explanation or f"replay failed: {error}"
        if explanation:
            res.explanation = explanation
        if ev is not None:
            ev.set()
        if self.progress is not None:
            self.progress(res)

    # -- explanations ----------------------------------------------------------
    def _explain(self, res: FlowResult) -> str:
        f = res.flow
        causes: list[str] = []
        for d in res.diffs:
            d.explanation = _diff_explanation(d)
        if res.unmapped:
            parts = []
            for u in res.unmapped:
                issuer = self.results.get(u["issued_by"])
                why = ("was not replayed" if issuer is None or issuer.status == SKIPPED
                       else f"got no new value in the replay ({issuer.status})")
                parts.append(f"{u['field']} {u['value']!r} ({u['kind']}) was handed out by "
                             f"recorded flow #{u['issued_by']}, which {why}")
            causes.append("the request carried values the broker never handed out in this "
                          "replay: " + "; ".join(parts))
        errs = [d for d in res.diffs if d.kind == "error-code"]
        if errs:
            causes.append("error codes differ: " + ", ".join(
                f"{d.path} {error_name(d.recorded)} recorded, {error_name(d.replayed)} now"
                for d in errs))
        mine = self._subjects(f)
        earlier = [r for r in self._order
                   if r.flow.request_ns < f.request_ns and r.flow.api_name in _WRITE_APIS
                   and r.status in (DIFFERING, FAILED) and self._subjects(r.flow) & mine]
        if earlier:
            causes.append("earlier state-changing flows on the same topic or group went "
                          "differently: " + ", ".join(
                              f"#{r.flow.id} {r.flow.api_name} ({r.status})"
                              for r in earlier[-3:]))
        if self._first_unexplained is not None:
            r0 = self._first_unexplained
            causes.append(f"the broker's state differed from the recorded one from the start "
                          f"(first seen in flow #{r0.flow.id} {r0.flow.api_name})")
        if f.api_name in _GROUP_APIS and not res.unmapped:
            causes.append("group coordination depends on timing and on the other members "
                          "(rebalances, session timeouts)")
        others = [d for d in res.diffs if d.kind != "error-code"]
        if others:
            shown = "; ".join(f"{d.path}: {d.explanation}" for d in others[:5])
            more = f" (+{len(others) - 5} more)" if len(others) > 5 else ""
            causes.append(f"{len(others)} field(s) differ: {shown}{more}")
        if not (res.unmapped or earlier or f.api_name in _GROUP_APIS
                or self._first_unexplained is not None):
            causes.append(f"no earlier flow of this replay explains it: the broker at "
                          f"{self.upstream[0]}:{self.upstream[1]} differs from the recorded "
                          f"one in state (data from before the replay) or behaviour")
            self._first_unexplained = res
        return ". ".join(causes)

    def _subjects(self, flow: Flow) -> set:
        """Topics and the group a flow is about (for relating differences)."""
        got = self._subject_cache.get(flow.id)
        if got is None:
            from .filters import flow_topics

            got = {("topic", t) for t in flow_topics(flow)}
            req = flow.request_decoded
            if req is not None and req.body is not None:
                g = req.body.get("GroupId")
                if g:
                    got.add(("group", g))
                for grp in req.body.get("Groups") or ():
                    if isinstance(grp, str):
                        got.add(("group", grp))
                    elif hasattr(grp, "get") and grp.get("GroupId"):
                        got.add(("group", grp.get("GroupId")))
            self._subject_cache[flow.id] = got
        return got


def _diff_explanation(d: Diff) -> str:
    leaf = d.path.rpartition(".")[2].split("[")[0].lower()
    if d.kind == "error-code":
        return f"{error_name(d.recorded)} recorded, {error_name(d.replayed)} now"
    if d.kind == "version":
        return f"the broker answered at body version {d.replayed}, recorded {d.recorded}"
    if d.kind == "missing":
        return ("an element the recorded broker answered with is missing now (the recorded "
                "broker held state this one lacks, or a write went differently)")
    if d.kind == "extra":
        return ("an element the recorded broker did not answer with appeared (this broker "
                "holds state the recorded one did not have, e.g. from before the replay)")
    if d.kind == "length":
        hint = _HINTS.get(leaf)
        base = f"{d.recorded} element(s) recorded, {d.replayed} now"
        return f"{base} ({hint})" if hint else base
    if d.kind == "null":
        return "null on one side only"
    if d.kind == "trailing":
        return (f"bytes after the body (which Kafka's clients do not read): "
                f"{d.recorded or 'none'} recorded, {d.replayed or 'none'} now")
    hint = _HINTS.get(leaf)
    base = f"{d.recorded!r} recorded, {d.replayed!r} now"
    if isinstance(d.recorded, str) and len(d.recorded) > 60:
        base = "values differ"
    return f"{base} ({hint})" if hint else base
