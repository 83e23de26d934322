"""The tolerance matrix: does a broker really skip tagged fields it does not know?

KIP-482 says a receiver must ignore unknown tagged fields. :func:`run_matrix` asks
a broker's ApiVersions, then for each api of a safe set and each flexible version
both the broker and the specs support, sends a baseline request built with the
codec and variants of it with one unknown tagged field injected

* in the request header (header v2),
* at the message's top level,
* in each nested struct level of the request (arrays are given one element so
  that every level exists),

with tag numbers just above the highest tag the spec defines at that level, a
large one (10000) and the largest allowed (2^31-1), and payloads of 0 B, 1 B,
1 KiB and 1 MiB. Every request goes on a fresh connection. Each cell is:

* ``tolerated``: a response equivalent to the baseline (fields that differ
  between two baseline answers, and ``ThrottleTimeMs``, are ignored);
* ``error``: a response that differs from the baseline and carries a non-zero
  error code the baseline's answer did not (``error_code``);
* ``different``: a response that differs from the baseline without a new error
  code (one the baseline's answer carried too is kept in ``error_code``);
* ``undecodable``: a response the codec cannot decode, or one that answers
  another request (its correlation id is not the request's: a client drops the
  connection on such an answer);
* ``disconnect``: the broker closed the connection without answering;
* ``timeout``: no answer within the timeout.

The baseline cell itself is ``tolerated`` when it was answered and decodable (its
error code, if any, is kept in ``error_code`` and shown as ``E<n>``); a baseline
that is not answered or cannot be decoded leaves that version without variants.
If the broker stops accepting connections (it crashed), the run stops there and
says so in ``truncated``.

Read-only apis by default; ``include_writes`` creates a scratch topic and adds
Produce, OffsetCommit and InitProducerId, and at the end deletes the topic and the
group OffsetCommit wrote to (``keep_scratch`` leaves them). The run is bounded by ``max_cells``
and ``budget`` seconds. Blocking sockets, one request at a time: a broker sees
at most one kinspect connection at once.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import __version__
from .codec import Codec, DecodeError, KinspectError, Request, Struct
from .codec.compiler import ForeignTag
from .codec.spec import StructSpec
from .codec.values import struct_class
from .flows import top_level_error_code
from .proxy.rules import (
    MAX_TAG,
    generated_payload,
    iter_targets,
    known_tags,
    parse_place,
)

#: read-only apis tried by default, in this order (those the broker and specs support)
SAFE_APIS = ("ApiVersions", "Metadata", "DescribeCluster", "FindCoordinator", "ListGroups",
             "DescribeGroups", "DescribeConfigs", "ListOffsets", "OffsetFetch",
             "DescribeTopicPartitions", "Fetch", "DescribeAcls", "ListPartitionReassignments",
             "DescribeUserScramCredentials", "DescribeLogDirs", "DescribeProducers",
             "DescribeTransactions", "ListTransactions", "DescribeClientQuotas")
#: apis added by ``include_writes`` (they write to the scratch topic / group)
WRITE_APIS = ("Produce", "OffsetCommit", "InitProducerId")
PAYLOAD_SIZES = (0, 1, 1024, 1 << 20)
LARGE_TAG = 10000
TAG_KINDS = ("above", "large", "max")
TAG_TITLES = {"above": "above known", "large": str(LARGE_TAG), "max": "2^31-1"}
OUTCOMES = ("tolerated", "error", "different", "undecodable", "disconnect", "timeout")
_SYMBOL = {"tolerated": "✓", "different": "≠", "undecodable": "?", "disconnect": "✗",
           "timeout": "T"}
_SIZE = struct.Struct(">i")
_VOLATILE_NAMES = frozenset({"ThrottleTimeMs"})


class MatrixError(KinspectError):
    """The matrix cannot run at all (broker unreachable, no ApiVersions answer)."""


@dataclass
class Cell:
    """One request sent and what came back.

    Attributes:
        api, api_key, version: the request.
        place: ``"baseline"``, ``"header"``, ``"top"`` or a struct path
            (``"Topics[0].Partitions[0]"``).
        tag_kind: ``"above"``, ``"large"`` or ``"max"`` (``None`` for the baseline).
        tag: the tag number injected (``None`` for the baseline).
        payload: payload size in bytes.
        outcome: one of :data:`OUTCOMES`.
        error_code: the first non-zero error code of the response, if any.
        detail: what differed, the decode error, or the socket error.
        ms: round-trip time in milliseconds (informational).
    """

    api: str
    api_key: int
    version: int
    place: str
    tag_kind: str | None
    tag: int | None
    payload: int
    outcome: str
    error_code: int | None = None
    detail: str | None = None
    ms: float = 0.0

    def symbol(self) -> str:
        if self.outcome == "error" or (self.place == "baseline" and self.error_code
                                       and self.outcome == "tolerated"):
            return f"E{self.error_code}"
        return _SYMBOL.get(self.outcome, "?")


@dataclass
class MatrixConfig:
    """Settings of a run.

    Attributes:
        bootstrap: broker ``(host, port)``.
        include_writes: create a scratch topic and add :data:`WRITE_APIS`; the
            topic, and the group the writes commit offsets for, are deleted at the
            end (DeleteTopics, DeleteGroups) unless ``keep_scratch``.
        keep_scratch: leave them on the broker (to look at them).
        timeout: seconds to wait for each answer.
        max_cells: most requests to send (baselines included).
        budget: seconds after which no new request is started.
        apis: api names to try (default :data:`SAFE_APIS` (+ writes)).
        payload_sizes, tag_kinds: the variants.
        client_id: the ClientId of every request.
    """

    bootstrap: tuple[str, int]
    include_writes: bool = False
    keep_scratch: bool = False
    timeout: float = 2.0
    max_cells: int = 3000
    budget: float = 45.0
    apis: tuple[str, ...] | None = None
    payload_sizes: tuple[int, ...] = PAYLOAD_SIZES
    tag_kinds: tuple[str, ...] = TAG_KINDS
    client_id: str = "kinspect-tolerate"


@dataclass
class MatrixReport:
    """The result of :func:`run_matrix` (``to_dict()`` is the JSON report)."""

    config: MatrixConfig
    broker_apis: dict[int, tuple[int, int]]
    tested: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    topic: str | None = None
    group: str | None = None
    truncated: str | None = None
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: every request sent to the broker: the cells' (each baseline twice, to tell
    #: the fields that change between answers) and the set-up's and clean-up's
    #: around them (ApiVersions, Metadata, CreateTopics, DeleteTopics, DeleteGroups)
    requests: int = 0

    def summary(self) -> dict[str, int]:
        out = {o: 0 for o in OUTCOMES}
        for c in self.cells:
            if c.place != "baseline":
                out[c.outcome] += 1
        return out

    def rows(self) -> list[dict[str, Any]]:
        """Cells grouped by (api, place), with consecutive versions of identical results
        merged: ``{"api", "versions", "place", "baseline", "cells": {tag_kind: [...]}}``."""
        by_ver: dict[tuple[str, int], dict[str, Any]] = {}
        order: list[tuple[str, int]] = []
        for c in self.cells:
            k = (c.api, c.version)
            if k not in by_ver:
                by_ver[k] = {"api_key": c.api_key, "baseline": None, "places": {}}
                order.append(k)
            if c.place == "baseline":
                by_ver[k]["baseline"] = c
            else:
                by_ver[k]["places"].setdefault(c.place, []).append(c)
        rows: list[dict[str, Any]] = []
        for (api, ver) in order:
            info = by_ver[(api, ver)]
            base = info["baseline"]
            places = info["places"] or {"-": []}
            for place, cells in places.items():
                grid = {}
                for kind in self.config.tag_kinds:
                    grid[kind] = [next((c for c in cells if c.tag_kind == kind and c.payload == n),
                                       None) for n in self.config.payload_sizes]
                sig = (base.symbol() if base else "-",
                       tuple((k, tuple(c.symbol() if c else "-" for c in v))
                             for k, v in grid.items()))
                prev = next((r for r in reversed(rows) if r["api"] == api
                             and r["place"] == place), None)
                if prev is not None and prev["_sig"] == sig and prev["_hi"] == ver - 1:
                    prev["_hi"] = ver
                    continue
                rows.append({"api": api, "api_key": info["api_key"], "place": place,
                             "_lo": ver, "_hi": ver, "_sig": sig, "baseline": sig[0],
                             "cells": {k: list(v) for k, v in sig[1]}})
        out = []
        for r in rows:
            lo, hi = r.pop("_lo"), r.pop("_hi")
            r.pop("_sig")
            r["versions"] = str(lo) if lo == hi else f"{lo}-{hi}"
            out.append(r)
        out.sort(key=lambda r: (r["api_key"], int(r["versions"].split("-")[0])))
        return out

    def to_dict(self) -> dict[str, Any]:
        cfg = asdict(self.config)
        cfg["bootstrap"] = "{}:{}".format(*self.config.bootstrap)
        return {
            "type": "tolerance-matrix",
            "kinspect": __version__,
            "config": cfg,
            "broker_apis": {str(k): list(v) for k, v in sorted(self.broker_apis.items())},
            "topic": self.topic,
            "group": self.group,
            "tested": self.tested,
            "skipped": self.skipped,
            "truncated": self.truncated,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed, 3),
            "requests": self.requests,
            "summary": self.summary(),
            "rows": self.rows(),
            "cells": [asdict(c) for c in self.cells],
        }

    def table(self):
        """A :class:`rich.table.Table`: one row per (api, versions, place); one column
        per tag number kind holding the outcomes for each payload size."""
        from rich.table import Table

        sizes = " ".join(_size_label(n) for n in self.config.payload_sizes)
        s = self.summary()
        title = (f"tolerance matrix {self.config.bootstrap[0]}:{self.config.bootstrap[1]}: "
                 f"{sum(s.values())} variants, {s['tolerated']} tolerated")
        t = Table(title=title, caption=LEGEND, caption_justify="left")
        rows = self.rows()

        def widest(key: str, header: str) -> int:
            return max([len(header)] + [len(r[key]) for r in rows])

        # on a narrow terminal (80 columns, or a pipe) the tag columns' titles wrap
        # ("tag above" / "known") and long places fold: names and outcomes stay whole
        # (rich squeezed the base column to nothing, then cut api names and places)
        t.add_column("api", no_wrap=True, min_width=widest("api", "api"))
        t.add_column("versions", justify="right", no_wrap=True,
                     min_width=widest("versions", "versions"))
        t.add_column("place", overflow="fold", min_width=min(widest("place", "place"), 12))
        t.add_column("base", justify="center", no_wrap=True, min_width=4)
        for kind in self.config.tag_kinds:
            t.add_column(f"tag {TAG_TITLES[kind]}\n{sizes}", justify="left",
                         min_width=len(sizes))
        for r in rows:
            t.add_row(r["api"], r["versions"], r["place"], _style(r["baseline"]),
                      *(" ".join(_style(x) for x in r["cells"][k]) for k in self.config.tag_kinds))
        return t


LEGEND = ("✓ tolerated (answer equals the baseline)  E<n> new error code n  ≠ different answer  "
          "✗ disconnect  T timeout  ? undecodable  - not run")


def _style(sym: str) -> str:
    if sym == "✓":
        return "[green]✓[/]"
    if sym.startswith("E"):
        return f"[yellow]{sym}[/]"
    if sym in ("✗", "T", "?", "≠"):
        return f"[red]{sym}[/]"
    return sym


def _size_label(n: int) -> str:
    if n >= 1 << 20:
        return f"{n >> 20}M"
    if n >= 1024:
        return f"{n >> 10}K"
    return f"{n}B"


# ---------------------------------------------------------------------------
# wire


def exchange(address: tuple[str, int], frame: bytes, timeout: float
             ) -> tuple[str, bytes | None, str | None]:
    """Send one request frame (no size prefix) on a fresh connection; return
    ``(status, response frame, detail)`` with status ``"ok"``, ``"disconnect"``,
    ``"timeout"`` or ``"refused"`` (no connection). The connection is closed afterwards."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except TimeoutError:
        return "timeout", None, "connect timed out"
    except OSError as e:
        return "refused", None, f"cannot connect to {address[0]}:{address[1]}: {e}"
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        try:
            sock.sendall(_SIZE.pack(len(frame)) + frame)
            head = _recv(sock, 4)
            if head is None:
                return "disconnect", None, "closed before answering"
            (size,) = _SIZE.unpack(head)
            if not 0 <= size <= 256 << 20:
                return "disconnect", None, f"bad response size {size}"
            body = _recv(sock, size)
            if body is None:
                return "disconnect", None, "closed in the middle of the answer"
            return "ok", body, None
        except TimeoutError:
            return "timeout", None, f"no answer within {timeout:g} s"
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
            return "disconnect", None, type(e).__name__
    finally:
        sock.close()


def _recv(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


# ---------------------------------------------------------------------------
# building requests


@dataclass
class BaselineContext:
    """Names and values the baseline requests refer to."""

    topic: str
    group: str
    topic_id: bytes
    client_id: str
    records: bytes
    #: the run created ``topic`` (CreateTopics answered without error)
    created_topic: bool = False


def _records(value: bytes = b"kinspect tolerate") -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    b.append(timestamp=None, key=None, value=value)
    b.close()
    return bytes(b.buffer())


def _overrides(api: str, ctx: BaselineContext, version: int) -> dict[str, Any]:
    """Field values by spec field name (any level) for a sensible request of ``api``."""
    common: dict[str, Any] = {
        "Name": ctx.topic, "Topic": ctx.topic, "TopicId": ctx.topic_id, "GroupId": ctx.group,
        "PartitionIndexes": [0], "ReplicaId": -1, "CurrentLeaderEpoch": -1, "Timestamp": -1,
        "PartitionIndex": 0, "Partition": 0,
    }
    per_api: dict[str, dict[str, Any]] = {
        "ApiVersions": {"ClientSoftwareName": "kinspect", "ClientSoftwareVersion": __version__},
        "Metadata": {"AllowAutoTopicCreation": False},
        "FindCoordinator": {"Key": ctx.group, "KeyType": 0, "CoordinatorKeys": [ctx.group]},
        "DescribeGroups": {"Groups": [ctx.group]},
        "DescribeConfigs": {"ResourceType": 2, "ResourceName": ctx.topic,
                            "ConfigurationKeys": None},
        "DescribeTopicPartitions": {"ResponsePartitionLimit": 100, "Cursor": None},
        "Fetch": {"MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20, "IsolationLevel": 0,
                  "SessionId": 0, "SessionEpoch": -1, "FetchOffset": 0,
                  "PartitionMaxBytes": 1 << 16, "LogStartOffset": -1, "LastFetchedEpoch": -1,
                  "ForgottenTopicsData": [], "RackId": ""},
        "ListOffsets": {"IsolationLevel": 0},
        "OffsetFetch": {"RequireStable": False, "MemberId": None, "MemberEpoch": -1},
        "DescribeAcls": {"ResourceTypeFilter": 1, "ResourceNameFilter": None,
                         "PatternTypeFilter": 1, "PrincipalFilter": None, "HostFilter": None,
                         "Operation": 1, "PermissionType": 1},
        "ListPartitionReassignments": {"TimeoutMs": 1000},
        "DescribeUserScramCredentials": {"Name": "kinspect-tolerate"},
        "DescribeLogDirs": {"Topic": ctx.topic},
        "DescribeProducers": {},
        "DescribeTransactions": {"TransactionalIds": ["kinspect-tolerate"]},
        "ListTransactions": {},
        "DescribeClientQuotas": {"Components": [], "Strict": False},
        "Produce": {"TransactionalId": None, "Acks": -1, "TimeoutMs": 5000, "Index": 0,
                    "Records": ctx.records},
        "OffsetCommit": {"GenerationIdOrMemberEpoch": -1, "GenerationId": -1, "MemberId": "",
                         "GroupInstanceId": None, "CommittedOffset": 0,
                         "CommittedLeaderEpoch": -1, "CommittedMetadata": "",
                         "RetentionTimeMs": -1},
        "InitProducerId": {"TransactionalId": None, "TransactionTimeoutMs": 60000,
                           "ProducerId": -1, "ProducerEpoch": -1},
    }
    return {**common, **per_api.get(api, {})}


def populate(st: StructSpec, version: int, values: dict[str, Any]) -> Struct:
    """A struct of ``st`` at ``version``: fields named in ``values`` take those values,
    arrays of structs get one populated element (so that every nested level exists),
    struct fields are populated, tagged fields and everything else keep defaults."""
    obj = struct_class(st)()
    for f in st.fields:
        if not f.versions.contains(version) or f.tagged_in(version):
            continue
        if f.name in values:
            v = values[f.name]
            if f.type == "uuid" and isinstance(v, bytes) and len(v) != 16:
                continue
            if f.is_array and v is not None and not isinstance(v, list):
                continue
            setattr(obj, f.name, list(v) if isinstance(v, list) else v)
            continue
        if f.struct is not None:
            if f.is_array:
                setattr(obj, f.name, [populate(f.struct, version, values)])
            elif getattr(obj, f.name) is not None:
                setattr(obj, f.name, populate(f.struct, version, values))
    return obj


def build_request(codec: Codec, api_key: int, version: int, ctx: BaselineContext,
                  correlation_id: int = 1) -> Request:
    """A baseline request of ``api_key`` at ``version`` (see :func:`populate`)."""
    spec = codec.registry.request(api_key)
    api = codec.api_name(api_key)
    body = populate(spec.struct, version, _overrides(api, ctx, version))
    hv = codec.request_header_version(api_key, version)
    hcls = codec.registry.header("RequestHeader").cls
    header = hcls(RequestApiKey=api_key, RequestApiVersion=version, CorrelationId=correlation_id,
                  ClientId=ctx.client_id)
    return Request(api_key, version, correlation_id, ctx.client_id, hv, header, body, 0, api)


def nested_places(spec_struct: StructSpec, body: Struct, version: int, prefix: str = ""
                  ) -> list[tuple[str, StructSpec]]:
    """``[(path, struct spec), ...]`` of every nested struct level present in ``body``
    (first element of arrays), depth first."""
    out = []
    for f in spec_struct.fields:
        if f.struct is None or not f.versions.contains(version) or f.tagged_in(version):
            continue
        v = getattr(body, f.name)
        if f.is_array:
            if not v:
                continue
            path = f"{prefix}{f.name}[0]"
            child = v[0]
        else:
            if v is None:
                continue
            path = f"{prefix}{f.name}"
            child = v
        out.append((path, f.struct))
        out.extend(nested_places(f.struct, child, version, path + "."))
    return out


# ---------------------------------------------------------------------------
# comparing answers


def _walk_diff(a: Any, b: Any, path: tuple, out: set) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            if k not in a or k not in b:
                out.add(path + (k,))
            else:
                _walk_diff(a[k], b[k], path + (k,), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _walk_diff(x, y, path + (i,), out)
    elif a != b:
        out.add(path)


def diff_paths(a: Any, b: Any) -> set[tuple]:
    """Paths (tuples of keys and indexes) where two ``to_dict()`` trees differ."""
    out: set[tuple] = set()
    _walk_diff(a, b, (), out)
    return out


def normalize(tree: Any, volatile: Iterable[tuple] = ()) -> Any:
    """``tree`` with ``ThrottleTimeMs`` and the ``volatile`` paths replaced by a marker."""
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: ("<volatile>" if k in _VOLATILE_NAMES else strip(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    out = strip(tree)
    for path in volatile:
        node = out
        for k in path[:-1]:
            try:
                node = node[k]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if node is not None:
            try:
                node[path[-1]] = "<volatile>"
            except (KeyError, IndexError, TypeError):
                pass
    return out


def _path_text(path: tuple) -> str:
    s = ""
    for k in path:
        s += f"[{k}]" if isinstance(k, int) else (("." if s else "") + str(k))
    return s


def first_error_code(tree: Any) -> int | None:
    """The first non-zero ``ErrorCode`` anywhere in a ``to_dict()`` tree."""
    if isinstance(tree, dict):
        code = tree.get("ErrorCode")
        if isinstance(code, int) and code:
            return code
        for v in tree.values():
            c = first_error_code(v)
            if c:
                return c
    elif isinstance(tree, list):
        for v in tree:
            c = first_error_code(v)
            if c:
                return c
    return None


def error_codes(tree: Any) -> list[int]:
    """Every non-zero ``ErrorCode`` of a ``to_dict()`` tree, depth first."""
    out: list[int] = []
    if isinstance(tree, dict):
        code = tree.get("ErrorCode")
        if isinstance(code, int) and not isinstance(code, bool) and code:
            out.append(code)
        for v in tree.values():
            out.extend(error_codes(v))
    elif isinstance(tree, list):
        for v in tree:
            out.extend(error_codes(v))
    return out


#: where an answer's bytes after its body (see :mod:`kinspect.codec.protocol`) are in
#: the tree :func:`classify` compares (no field has a name with spaces)
TRAILING_KEY = "(bytes after the body)"


def answer_tree(resp: Any) -> dict[str, Any]:
    """What of a decoded answer is compared: its body's ``to_dict()``, and its bytes
    after the body as hex under :data:`TRAILING_KEY` when it has some (Kafka's
    clients do not read them, but the broker wrote them)."""
    tree = resp.body.to_dict()
    if resp.trailing:
        tree[TRAILING_KEY] = resp.trailing.hex()
    return tree


def classify(codec: Codec, api_key: int, version: int, status: str, frame: bytes | None,
             detail: str | None, baseline: Any, volatile: set[tuple], *,
             correlation_id: int | None = None) -> tuple[str, int | None, str | None]:
    """``(outcome, error_code, detail)`` of one answer compared with the baseline
    (a normalized ``to_dict()`` tree; ``None`` when classifying the baseline).
    ``correlation_id``: the request's; an answer carrying another one is
    ``undecodable`` (it cannot be matched to the request: Kafka protocol guide,
    "Requests and Responses")."""
    if status != "ok":
        return status, None, detail
    if correlation_id is not None and frame is not None and len(frame) >= 4:
        got = codec.response_correlation_id(frame)
        if got != correlation_id:
            return "undecodable", None, (f"answer carries correlation id {got}, not the "
                                         f"request's {correlation_id}")
    try:
        resp = codec.decode_response(frame, api_key, version)
    except DecodeError as e:
        return "undecodable", None, str(e)
    tree = answer_tree(resp)
    code = top_level_error_code(resp.body, resp.body_version) or first_error_code(tree)
    if baseline is None:  # the baseline itself: equivalent to itself, error code noted
        return "tolerated", code, None
    norm = normalize(tree, volatile)
    if norm == baseline:
        return "tolerated", code, None
    diffs = sorted(diff_paths(baseline, norm), key=lambda p: tuple(map(str, p)))
    where = ", ".join(_path_text(p) for p in diffs[:3]) + (" ..." if len(diffs) > 3 else "")
    # an error is an error code the baseline's answer did not carry: the same code as
    # the baseline's (an unknown topic, say) says nothing about the injected tag
    new = Counter(error_codes(norm))
    new.subtract(Counter(error_codes(baseline)))
    fresh = [c for c in error_codes(norm) if new[c] > 0]
    if fresh:
        first = code if code in fresh else fresh[0]
        return "error", first, f"differs at {where}"
    return "different", code or None, f"differs at {where}"


# ---------------------------------------------------------------------------
# the run


def _api_versions(codec: Codec, address: tuple[str, int], timeout: float, client_id: str
                  ) -> dict[int, tuple[int, int]]:
    ctx = BaselineContext("-", "-", bytes(16), client_id, b"")
    req = build_request(codec, 18, 0, ctx)
    status, frame, detail = exchange(address, codec.encode_request(req), timeout)
    if status == "refused":
        raise MatrixError(detail)
    if status != "ok":
        raise MatrixError(f"no ApiVersions answer from {address[0]}:{address[1]}: {detail}")
    try:
        resp = codec.decode_response(frame, 18, 0)
    except DecodeError as e:
        raise MatrixError(f"cannot decode the ApiVersions answer: {e}") from None
    if resp.body.ErrorCode:
        raise MatrixError(f"ApiVersions answered error {resp.body.ErrorCode}")
    return {k.ApiKey: (k.MinVersion, k.MaxVersion) for k in resp.body.ApiKeys}


def _send(codec: Codec, address, req: Request, timeout: float, report: MatrixReport):
    frame = codec.encode_request(req)
    report.requests += 1
    t0 = time.perf_counter()
    status, resp, detail = exchange(address, frame, timeout)
    return status, resp, detail, (time.perf_counter() - t0) * 1000


def _prepare_topic(codec: Codec, cfg: MatrixConfig, apis: dict[int, tuple[int, int]],
                   ctx: BaselineContext, report: MatrixReport) -> None:
    """Create the scratch topic (writes) or pick an existing one; learn its topic id."""
    address = cfg.bootstrap
    if cfg.include_writes and 19 in apis:
        spec = codec.registry.request(19)
        v = min(apis[19][1], spec.valid_versions.highest)
        body = populate(spec.struct, v, {
            "Name": ctx.topic, "NumPartitions": 1, "ReplicationFactor": 1, "Assignments": [],
            "Configs": [], "timeoutMs": 5000, "TimeoutMs": 5000})
        hcls = codec.registry.header("RequestHeader").cls
        req = Request(19, v, 1, ctx.client_id, codec.request_header_version(19, v),
                      hcls(RequestApiKey=19, RequestApiVersion=v, CorrelationId=1,
                           ClientId=ctx.client_id), body, 0, "CreateTopics")
        status, frame, detail, _ = _send(codec, address, req, cfg.timeout, report)
        if status == "ok":
            resp = codec.decode_response(frame, 19, v)
            code = resp.body.Topics[0].ErrorCode if resp.body.Topics else None
            ctx.created_topic = not code
            report.notes.append(f"created scratch topic {ctx.topic}" if not code else
                                f"CreateTopics {ctx.topic}: error {code}")
        else:
            report.notes.append(f"CreateTopics {ctx.topic}: {status} ({detail})")
    if 3 not in apis:
        return
    spec = codec.registry.request(3)
    v = min(apis[3][1], spec.valid_versions.highest)
    req = build_request(codec, 3, v, ctx)
    if not cfg.include_writes:
        req.body.Topics = None  # all topics: pick one that exists, if any
    status, frame, _, _ = _send(codec, address, req, cfg.timeout, report)
    if status != "ok":
        return
    try:
        resp = codec.decode_response(frame, 3, v)
    except DecodeError:
        return
    topics = [t for t in resp.body.Topics or [] if not t.ErrorCode and t.Name]
    if not cfg.include_writes and topics:
        ctx.topic = min(t.Name for t in topics)
    for t in topics:
        if t.Name == ctx.topic and "TopicId" in t:
            ctx.topic_id = t.TopicId


def _admin(codec: Codec, cfg: MatrixConfig, apis: dict[int, tuple[int, int]],
           ctx: BaselineContext, report: MatrixReport, api_key: int, values: dict[str, Any],
           results: str) -> str:
    """Send one admin request built from ``values`` (:func:`populate`) at the
    highest version both sides know; return what became of it: ``"ok"``, ``"error
    N NAME"`` (the first error code of the ``results`` array) or the exchange's
    status."""
    from .show import error_name

    spec = codec.registry.request(api_key)
    v = min(apis[api_key][1], spec.valid_versions.highest)
    body = populate(spec.struct, v, values)
    hcls = codec.registry.header("RequestHeader").cls
    req = Request(api_key, v, 1, ctx.client_id, codec.request_header_version(api_key, v),
                  hcls(RequestApiKey=api_key, RequestApiVersion=v, CorrelationId=1,
                       ClientId=ctx.client_id), body, 0, codec.api_name(api_key))
    status, frame, detail, _ = _send(codec, cfg.bootstrap, req, cfg.timeout, report)
    if status != "ok":
        return f"{status} ({detail})" if detail else status
    try:
        resp = codec.decode_response(frame, api_key, v)
    except DecodeError as e:
        return f"undecodable answer ({e})"
    code = next((r.ErrorCode for r in getattr(resp.body, results) or () if r.ErrorCode), 0)
    return "ok" if not code else f"error {code} {error_name(code)}"


def _clean_up(codec: Codec, cfg: MatrixConfig, apis: dict[int, tuple[int, int]],
              ctx: BaselineContext, report: MatrixReport, wrote_group: bool) -> None:
    """Delete the scratch topic this run created, and the group its OffsetCommit
    wrote to (``include_writes``), noting what became of each."""
    if not cfg.include_writes:
        return
    if cfg.keep_scratch:
        if ctx.created_topic or wrote_group:
            report.notes.append(f"kept scratch topic {ctx.topic} and group {ctx.group} "
                                f"(--keep-scratch)")
        return
    if ctx.created_topic:
        if 20 not in apis:
            report.notes.append(f"scratch topic {ctx.topic} left: the broker has no "
                                f"DeleteTopics")
        else:
            got = _admin(codec, cfg, apis, ctx, report, 20,
                         {"TopicNames": [ctx.topic], "Name": ctx.topic, "TimeoutMs": 5000},
                         "Responses")
            report.notes.append(f"deleted scratch topic {ctx.topic}" if got == "ok" else
                                f"DeleteTopics {ctx.topic}: {got}")
    if wrote_group:
        if 42 not in apis:
            report.notes.append(f"scratch group {ctx.group} left: the broker has no "
                                f"DeleteGroups")
        else:
            got = _admin(codec, cfg, apis, ctx, report, 42, {"GroupsNames": [ctx.group]},
                         "Results")
            report.notes.append(f"deleted scratch group {ctx.group}" if got == "ok" else
                                f"DeleteGroups {ctx.group}: {got}")


def run_matrix(cfg: MatrixConfig, codec: Codec | None = None,
               progress: Callable[[Cell], None] | None = None) -> MatrixReport:
    """Run the matrix (see the module docstring) and return its report.

    Args:
        progress: called with every cell as it completes.
    Raises:
        MatrixError: the broker cannot be reached or gives no ApiVersions answer.
    """
    codec = codec or Codec()
    start = time.monotonic()
    deadline = start + cfg.budget
    address = cfg.bootstrap
    apis = _api_versions(codec, address, cfg.timeout, cfg.client_id)
    report = MatrixReport(cfg, apis, requests=1)  # (and _api_versions' one)
    suffix = uuid.uuid4().hex[:8]
    ctx = BaselineContext(topic=f"kinspect-tolerate-{suffix}", group=f"kinspect-tolerate-{suffix}",
                   topic_id=bytes(16), client_id=cfg.client_id, records=_records())
    _prepare_topic(codec, cfg, apis, ctx, report)
    report.topic, report.group = ctx.topic, ctx.group

    names = cfg.apis or (SAFE_APIS + (WRITE_APIS if cfg.include_writes else ()))
    plan: list[tuple[int, int]] = []
    for name in names:
        try:
            key = codec.registry.api_key(name)
        except KeyError:
            report.skipped[name] = "no spec defines it"
            continue
        spec = codec.registry.request(key)
        if key not in apis:
            report.skipped[name] = "the broker does not advertise it"
            continue
        lo, hi = apis[key]
        vers = [v for v in range(lo, hi + 1)
                if spec.valid_versions.contains(v) and spec.is_flexible(v)]
        if not vers:
            report.skipped[name] = (f"no flexible version in common (broker {lo}-{hi}, "
                                    f"specs {spec.valid_versions}, flexible "
                                    f"{spec.flexible_versions})")
            continue
        report.tested.append({"api": name, "api_key": key, "versions": vers})
        plan.extend((key, v) for v in vers)

    sent = 0

    def budget_left() -> bool:
        nonlocal sent
        if sent >= cfg.max_cells:
            report.truncated = report.truncated or f"stopped at --max-cells {cfg.max_cells}"
            return False
        if time.monotonic() >= deadline:
            report.truncated = report.truncated or f"stopped at the {cfg.budget:g} s budget"
            return False
        return True

    def record(cell: Cell) -> None:
        if cell.outcome == "refused":  # the broker went away (crashed?): stop here
            cell.outcome = "disconnect"
            report.truncated = (f"the broker stopped accepting connections after "
                                f"{cell.api} v{cell.version} {cell.place}: {cell.detail}")
        report.cells.append(cell)
        if progress is not None:
            progress(cell)

    for key, v in plan:
        if report.truncated or not budget_left():
            break
        api = codec.api_name(key)
        base = build_request(codec, key, v, ctx)
        status, frame, detail, ms = _send(codec, address, base, cfg.timeout, report)
        sent += 1
        outcome, code, detail = classify(codec, key, v, status, frame, detail, None, set(),
                                         correlation_id=base.correlation_id)
        record(Cell(api, key, v, "baseline", None, None, 0, outcome, code, detail, round(ms, 2)))
        if status != "ok" or outcome == "undecodable":
            continue
        first = answer_tree(codec.decode_response(frame, key, v))
        volatile: set[tuple] = set()
        if budget_left():
            status2, frame2, _, _ = _send(codec, address, base, cfg.timeout, report)
            sent += 1
            if status2 == "ok":
                try:
                    second = answer_tree(codec.decode_response(frame2, key, v))
                    volatile = diff_paths(normalize(first), normalize(second))
                except DecodeError:
                    pass
        baseline = normalize(first, volatile)

        spec = codec.registry.request(key)
        places: list[tuple[str, StructSpec]] = []
        if base.header_version >= 2:
            places.append(("header", codec.registry.header("RequestHeader").spec.struct))
        places.append(("top", spec.struct))
        places.extend(nested_places(spec.struct, base.body, v))
        for place, st in places:
            known = known_tags(st, v)
            tags = {"above": (max(known) + 1) if known else 0, "large": LARGE_TAG,
                    "max": MAX_TAG}
            for kind in cfg.tag_kinds:
                tag = tags[kind]
                for n in cfg.payload_sizes:
                    if report.truncated or not budget_left():
                        break
                    req = Request(base.api_key, v, base.correlation_id, base.client_id,
                                  base.header_version, Struct.copy(base.header),
                                  Struct.copy(base.body), 0, api)
                    if place == "header":
                        targets = [req.header]
                    else:
                        _, steps = parse_place(place)
                        targets = list(iter_targets(req.body, steps))
                    for t in targets:
                        t.unknown_tags[ForeignTag(tag)] = generated_payload(n)
                    status, frame, detail, ms = _send(codec, address, req, cfg.timeout, report)
                    sent += 1
                    outcome, code, detail = classify(codec, key, v, status, frame, detail,
                                                     baseline, volatile,
                                                     correlation_id=req.correlation_id)
                    record(Cell(api, key, v, place, kind, tag, n, outcome, code, detail,
                                round(ms, 2)))
    _clean_up(codec, cfg, apis, ctx, report,
              any(key == 8 for key, _ in plan))  # (OffsetCommit)
    report.elapsed = time.monotonic() - start
    return report
