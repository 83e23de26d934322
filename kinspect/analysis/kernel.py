"""Per-flow work shared by both engines: decode one request/response pair into a
flow row plus the facts the other tables aggregate, and size its messages under
the what-if encodings.

Plain Python over :mod:`kinspect.codec`; no Spark here. The Spark job runs it on
the executors (inside ``mapInArrow``), the single-process reference runs it in a
loop, so both see identical per-flow facts and differ only in reading, pairing
and aggregating.

Input pairs are dicts with the columns of :data:`kinspect.analysis.schema.PAIR`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..codec import Codec, DecodeError, EncodeError, KinspectError, SpecRegistry
from ..codec.records import decode_records
from ..codec.spec import MessageSpec, StructSpec, uuid_to_text
from ..codec.values import java_string
from ..codec.whatif import TagStats, VarintSizer, encode_message, scan_message
from ..flows import TRAILING, top_level_error_code

API_VERSIONS = 18
PARTITION_FIELDS = ("PartitionIndex", "Partition", "Index", "PartitionId")
_ZERO_UUID = bytes(16)


def nearest_rank(sorted_values: list[int], p: int) -> int | None:
    """The ``p``-th percentile (integer ``p`` in 1..100) by the nearest-rank method:
    the value at 1-based rank ``ceil(p * n / 100)`` of the ascending values
    (``None`` for no values). Exact and deterministic; the Spark job computes the
    same rank with integer arithmetic ``(p * n + 99) div 100``."""
    n = len(sorted_values)
    if n == 0:
        return None
    return sorted_values[(p * n + 99) // 100 - 1]


# ---------------------------------------------------------------------------
# spec loading on executors

_REGISTRIES: dict[tuple, SpecRegistry] = {}


def load_registry(spec_paths: Iterable[str] = (), *, defaults: bool = True) -> SpecRegistry:
    """The spec registry for a job: ``spec_paths`` (directories or zip/jar archives)
    first; with ``defaults`` also ``KINSPECT_SPECS``, the project's ``specs/`` and
    kafka-python's bundled set (:func:`kinspect.codec.default_registry`'s path).
    Cached per process, so each Python worker loads it once."""
    key = (tuple(spec_paths), defaults, os.environ.get("KINSPECT_SPECS", "") if defaults else "")
    reg = _REGISTRIES.get(key)
    if reg is None:
        if defaults:
            reg = SpecRegistry.load(list(spec_paths))
        else:
            reg = SpecRegistry.load(list(spec_paths), use_env=False, use_project=False,
                                    use_default=False)
        _REGISTRIES[key] = reg
    return reg


# ---------------------------------------------------------------------------
# struct facts: topic/partition context, records, error codes


class _StructInfo:
    __slots__ = ("children", "error_code", "partition", "records", "topic_id", "topic_name")

    def __init__(self, st: StructSpec, version: int):
        self.topic_name = self.topic_id = self.partition = self.error_code = None
        self.records: list[str] = []
        self.children: list[tuple[str, StructSpec, bool]] = []
        for f in st.fields:
            if not f.versions.contains(version):
                continue
            if f.type == "string" and f.entity_type == "topicName" and self.topic_name is None:
                self.topic_name = f.name
            elif f.type == "uuid" and f.name == "TopicId":
                self.topic_id = f.name
            elif f.type == "int32" and f.name in PARTITION_FIELDS and self.partition is None:
                self.partition = f.name
            elif f.type == "records":
                self.records.append(f.name)
            elif f.name == "ErrorCode" and f.type == "int16":
                self.error_code = f.name
            elif f.struct is not None:
                self.children.append((f.name, f.struct, f.is_array))


class FlowAnalyzer:
    """Decodes request/response pairs (see the module docstring).

    Args:
        registry: the specs to decode with.
    """

    def __init__(self, registry: SpecRegistry):
        self.registry = registry
        self.codec = Codec(registry)
        self._info: dict[tuple[int, int], _StructInfo] = {}
        self._has_records: dict[str, bool] = {}

    # -- decoding ----------------------------------------------------------------
    def decode_pair(self, pair: dict) -> tuple[Any, Any, list[str]]:
        """``(request, response, errors)``: decoded :class:`~kinspect.codec.Request`
        / :class:`~kinspect.codec.Response` (``None`` when absent or undecodable; a
        request whose body fails keeps its header-only decode) and error texts."""
        errors: list[str] = []
        req = resp = None
        api_key = pair.get("api_key")
        req_frame = pair.get("req_frame")
        # api_key None: a capture line without it (another tool's): read the header
        if req_frame is not None and (api_key is None or api_key >= 0):
            try:
                req = self.codec.decode_request(req_frame)
            except DecodeError as e:
                errors.append(f"request: {e}")
                try:
                    req = self.codec.decode_request(req_frame, body=False)
                except DecodeError:
                    req = None
        resp_frame = pair.get("resp_frame")
        if resp_frame is not None and req is not None:
            try:
                resp = self.codec.decode_response(resp_frame, req.api_key, req.api_version)
            except DecodeError as e:
                errors.append(f"response: {e}")
        return req, resp, errors

    def flow_row(self, pair: dict) -> dict:
        """One row of :data:`~kinspect.analysis.schema.DECODED` for a pair."""
        req, resp, errors = self.decode_pair(pair)
        req_frame, resp_frame = pair.get("req_frame"), pair.get("resp_frame")
        api_key = pair.get("api_key")
        flags = set(pair.get("req_flags") or ()) | set(pair.get("resp_flags") or ())
        if any(m is not None and m.trailing for m in (req, resp)):
            flags.add(TRAILING)  # (as the proxy flags it: a capture of another tool's too)
        if req_frame is None:
            flags.add("unpaired")
            api_key = -1
        if req is not None:
            api_key = req.api_key
        elif api_key is None:
            api_key = -1
        if req is not None:
            api_name = req.api_name
        elif "sasl" in flags:
            api_name = "SaslToken"
        elif req_frame is None:
            api_name = "Unpaired"
        elif api_key >= 0:
            api_name = self.codec.api_name(api_key)
        else:
            api_name = "Malformed"
        req_ns, resp_ns = pair.get("req_ns"), pair.get("resp_ns")
        row: dict[str, Any] = {
            "capture": pair["capture"], "conn": pair["conn"], "flow": pair.get("flow"),
            "client": pair.get("client"), "upstream": pair.get("upstream"),
            "api_key": api_key, "api_name": api_name,
            "api_version": (req.api_version if req is not None else
                            pair.get("api_version") if api_key >= 0 else -1),
            "correlation_id": pair.get("correlation_id"),
            # strings as Kafka reads them: Arrow columns take valid Unicode only
            "client_id": java_string(req.client_id) if req is not None else None,
            "request_header_version": req.header_version if req is not None else None,
            "response_header_version": resp.header_version if resp is not None else None,
            "request_bytes": len(req_frame) if req_frame is not None else None,
            "response_bytes": len(resp_frame) if resp_frame is not None else None,
            "response_sent_bytes": pair.get("resp_sent_bytes"),
            "request_ns": req_ns, "response_ns": resp_ns,
            "latency_ns": (resp_ns - req_ns) if (req_ns is not None and resp_ns is not None
                                                 and req_frame is not None) else None,
            "error_code": None, "partition_errors": [],
            "request_decoded": req is not None and req.body is not None,
            "response_decoded": resp is not None and resp.body is not None,
            "decode_error": None,
            "flags": sorted(flags),
            "client_software_name": None, "client_software_version": None,
            "tagged": [], "topics": [], "topic_names": [], "negative_fields": [],
        }
        negative: set[str] = set()
        stats_req, stats_resp = TagStats(), TagStats()
        topics: dict[tuple, list[int]] = {}
        names: set[tuple[str, str]] = set()
        if req is not None:
            hspec = self.codec.registry.header("RequestHeader").spec
            scan_message(hspec, req.header, req.header_version, negative=negative,
                         stats=stats_req)
            if req.body is not None:
                spec = self.registry.request(req.api_key)
                scan_message(spec, req.body, req.api_version, negative=negative,
                             stats=stats_req)
                self._facts(spec, req.body, req.api_version, "produce", topics, names, None,
                            errors)
                if req.api_key == API_VERSIONS and req.api_version >= 3:
                    row["client_software_name"] = java_string(req.body.get("ClientSoftwareName"))
                    row["client_software_version"] = java_string(
                        req.body.get("ClientSoftwareVersion"))
        if resp is not None and resp.body is not None:
            hspec = self.codec.registry.header("ResponseHeader").spec
            scan_message(hspec, resp.header, resp.header_version, negative=negative,
                         stats=stats_resp)
            spec = self.registry.response(resp.api_key)
            scan_message(spec, resp.body, resp.body_version, negative=negative,
                         stats=stats_resp)
            perrs: list[dict] = []
            self._facts(spec, resp.body, resp.body_version, "fetch", topics, names, perrs,
                        errors)
            row["error_code"] = top_level_error_code(resp.body, resp.body_version)
            row["partition_errors"] = perrs
        row["tagged"] = _tag_rows("request", stats_req) + _tag_rows("response", stats_resp)
        row["topics"] = [
            {"direction": k[0], "topic": k[1], "topic_id": k[2], "partition": k[3],
             "codec": k[4], "batches": v[0], "records": v[1], "bytes": v[2],
             "payload_bytes": v[3], "uncompressed_bytes": v[4]}
            for k, v in sorted(topics.items(), key=lambda kv: tuple("" if x is None else str(x)
                                                                      for x in kv[0]))]
        row["topic_names"] = [{"topic_id": i, "topic": n} for i, n in sorted(names)]
        row["negative_fields"] = sorted(negative)
        if errors:
            row["decode_error"] = "; ".join(errors)
        return row

    # -- walking bodies ------------------------------------------------------------
    def info(self, st: StructSpec, version: int) -> _StructInfo:
        key = (id(st), version)
        i = self._info.get(key)
        if i is None:
            i = self._info[key] = _StructInfo(st, version)
        return i

    def _facts(self, spec: MessageSpec, body: Any, version: int, direction: str,
               topics: dict, names: set, perrs: list | None, errors: list[str]) -> None:
        has = self._has_records.get(spec.name)
        if has is None:
            has = self._has_records[spec.name] = any(
                f.type == "records" for st in spec.structs() for f in st.fields)
        if not has and perrs is None:
            return
        self._walk(spec.struct, body, version, direction, None, None, 0, topics, names, perrs,
                   errors)

    def _walk(self, st: StructSpec, o: Any, version: int, direction: str, topic: str | None,
              topic_id: str | None, depth: int, topics: dict, names: set,
              perrs: list | None, errors: list[str]) -> None:
        info = self.info(st, version)
        if info.topic_name is not None:
            topic = java_string(getattr(o, info.topic_name))
        if info.topic_id is not None:
            raw = getattr(o, info.topic_id)
            tid = uuid_to_text(raw) if raw and raw != _ZERO_UUID else None
            if tid is not None:
                topic_id = tid
                if info.topic_name is not None and topic is not None:
                    names.add((tid, topic))
        partition = getattr(o, info.partition) if info.partition is not None else None
        if perrs is not None and depth > 0 and info.error_code is not None:
            code = getattr(o, info.error_code)
            if code:
                perrs.append({"topic": topic if topic is not None else topic_id,
                              "partition": partition, "error_code": code})
        for name in info.records:
            data = getattr(o, name)
            if data is None:
                continue
            self._records(bytes(data), direction, topic, topic_id, partition, topics, errors)
        for name, sub, is_array in info.children:
            v = getattr(o, name)
            if v is None:
                continue
            if is_array:
                for x in v:
                    self._walk(sub, x, version, direction, topic, topic_id, depth + 1, topics,
                               names, perrs, errors)
            else:
                self._walk(sub, v, version, direction, topic, topic_id, depth + 1, topics,
                           names, perrs, errors)

    def _records(self, data: bytes, direction: str, topic: str | None, topic_id: str | None,
                 partition: int | None, topics: dict, errors: list[str]) -> None:
        base = (direction, topic, topic_id, partition)
        try:
            rs = decode_records(data)
        except DecodeError as e:
            errors.append(f"records of {topic or topic_id}[{partition}]: {e}")
            _add(topics, base + ("(undecodable)",), 0, 0, len(data), 0, 0)
            return
        for b in rs.batches:
            _add(topics, base + (b.compression,), 1, b.record_count, b.size_bytes,
                 b.compressed_size, b.uncompressed_size)
        if rs.partial is not None:
            _add(topics, base + ("(partial)",), 0, 0, rs.partial.available, 0, 0)

    # -- what-if -----------------------------------------------------------------
    def what_if_rows(self, pair: dict, sizer: VarintSizer) -> list[dict]:
        """Rows of :data:`~kinspect.analysis.schema.WHAT_IF` for the decoded messages
        of a pair (none for undecodable ones). ``sizer.negative`` decides ``best``."""
        req, resp, _ = self.decode_pair(pair)
        out = []
        base = {"capture": pair["capture"], "conn": pair["conn"], "flow": pair.get("flow")}
        reg = self.codec.registry
        if req is not None and req.body is not None:
            out.append(self._sizes(base, req, "request", pair["req_frame"],
                                   reg.header("RequestHeader").spec, req.header_version,
                                   reg.request(req.api_key), req.api_version, sizer))
        if resp is not None and resp.body is not None:
            out.append(self._sizes(base, resp, "response", pair["resp_frame"],
                                   reg.header("ResponseHeader").spec, resp.header_version,
                                   reg.response(resp.api_key), resp.body_version, sizer))
        return out

    def _sizes(self, base: dict, msg: Any, direction: str, frame: bytes, hspec: MessageSpec,
               hv: int, spec: MessageSpec, version: int, sizer: VarintSizer) -> dict:
        parts = ((hspec, msg.header, hv), (spec, msg.body, version))
        row = dict(base)
        row.update(api_key=msg.api_key, api_name=msg.api_name, api_version=msg.api_version,
                   direction=direction, message=spec.name, bytes=len(frame))

        def total(fn) -> int | None:
            n = len(msg.trailing)  # (bytes after the body: in the frame whatever the layout)
            for s, v, ver in parts:
                try:
                    k = fn(s, v, ver)
                except EncodeError:
                    return None
                if k is None:
                    return None
                n += k
            return n

        reg = self.registry
        row["fixed_bytes"] = total(lambda s, v, ver: len(reg.codec(s).encode(v, ver)))
        for variant in ("packed", "upacked", "best"):
            row[f"{variant}_bytes"] = total(
                lambda s, v, ver, variant=variant: sizer.size(s, v, ver, variant))
        row["best_elements_bytes"] = total(lambda s, v, ver: len(encode_message(
            s, v, ver, ints=sizer.kinds(s, elements=True), elements=True)))
        row["draft_a_bytes"] = total(lambda s, v, ver: len(encode_message(
            s, v, ver, layout="draft-a")))
        row["draft_b_bytes"] = total(lambda s, v, ver: len(encode_message(
            s, v, ver, layout="draft-b")))
        return row


def _add(topics: dict, key: tuple, batches: int, records: int, nbytes: int, payload: int,
         uncompressed: int) -> None:
    v = topics.get(key)
    if v is None:
        topics[key] = [batches, records, nbytes, payload, uncompressed]
    else:
        v[0] += batches
        v[1] += records
        v[2] += nbytes
        v[3] += payload
        v[4] += uncompressed


def _tag_rows(direction: str, stats: TagStats) -> list[dict]:
    rows = []
    for path, (count, nbytes, data) in sorted(stats.sections.items()):
        rows.append({"direction": direction, "message": path.split(".", 1)[0], "path": path,
                     "tag": -1, "name": None, "kind": "section", "count": count,
                     "data_bytes": data, "bytes": nbytes})
    for (path, tag), (name, count, data, nbytes) in sorted(stats.tags.items()):
        rows.append({"direction": direction, "message": path.split(".", 1)[0], "path": path,
                     "tag": tag, "name": name, "kind": "known" if name is not None else "unknown",
                     "count": count, "data_bytes": data, "bytes": nbytes})
    return rows


__all__ = ["FlowAnalyzer", "KinspectError", "load_registry", "nearest_rank"]
