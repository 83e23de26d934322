"""Differential check against an independent codec: kafka-python 3's compiled
per-(struct, version) encoder/decoder (``kafka.protocol.*``).

1. Generated values: for every message kafka-python defines and every version,
   kinspect's bytes decode with kafka-python to the same values field by field,
   and kafka-python re-encodes them to the very same bytes.
2. Real traffic: a real kafka-python client talks to a real broker (Tansu) through
   the proxy; every request and response frame decodes to the same values with both.

kafka-python limitations kept out of the comparison (documented, not hidden):
it drops unknown tagged fields when re-encoding, so generated values carry none
here (kinspect's handling of them is covered by test_conformance); it decodes any
ApiVersionsResponse with a non-zero error code as v0 (Kafka does so only for
UNSUPPORTED_VERSION), so generated ApiVersions responses use error code 0; it
leaves an absent tagged struct as None where Kafka (and kinspect) use the
struct's default value.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import uuid

import kafka.protocol as kp_protocol
import pytest
from hypothesis import HealthCheck, given, settings
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.base import BaseField
from strategies import message_values

from kinspect.codec import SpecRegistry
from kinspect.codec.registry import kafka_python_specs
from kinspect.codec.values import Struct


def _kp_classes() -> dict[str, type]:
    for m in pkgutil.walk_packages(kp_protocol.__path__, "kafka.protocol."):
        if not m.name.endswith(".generate_stubs"):
            importlib.import_module(m.name)
    out: dict[str, type] = {}
    stack = list(ApiMessage.__subclasses__())
    while stack:
        c = stack.pop()
        stack.extend(c.__subclasses__())
        if getattr(c, "_class_version", None) is None and getattr(c, "_json", None):
            out[c._json["name"]] = c
    return out


KP = _kp_classes()
REG = SpecRegistry.load([str(kafka_python_specs())], use_env=False, use_project=False,
                        use_default=False)
PAIRS = [pytest.param(name, v, id=f"{name}-v{v}")
         for name in sorted(KP) if name in REG.messages
         for v in range(REG.messages[name].valid_versions.lowest,
                        REG.messages[name].valid_versions.highest + 1)]


def test_kafka_python_covers_most_of_its_spec_set():
    assert len(KP) >= 100 and len(PAIRS) >= 450


def _strip_unknown(v):
    if isinstance(v, Struct):
        v.unknown_tags = None
        for n in v._fields:
            _strip_unknown(getattr(v, n))
    elif isinstance(v, list):
        for x in v:
            _strip_unknown(x)
    return v


def _kp_decode(cls, body: bytes, version: int):
    obj = cls.decode(body, version=version)
    for attr in ("_header", "_min_version", "_max_version"):  # encode() expects them
        try:
            object.__getattribute__(obj, attr)
        except AttributeError:
            object.__setattr__(obj, attr, None)
    return obj


def _bits(x: int) -> set[int] | None:
    bits = {i for i in range(32) if (x & 0xFFFFFFFF) >> i & 1}
    return None if bits == {31} else bits


def assert_same(ours: Struct, theirs, version: int, path: str = "") -> int:
    """Compare field by field; return how many leaf values were compared."""
    n = 0
    for f in ours._spec.fields:
        if not f.versions.contains(version):
            continue
        where = f"{path}.{f.name}" if path else f.name
        mine = getattr(ours, f.name)
        kname = BaseField.underscore_name(f.name)
        if kname not in theirs._struct.fields:
            # kafka-python renames some fields (json_patch), e.g. *AuthorizedOperations
            kname = "authorized_operations"
        other = getattr(theirs, kname)
        if f.struct is not None:
            if other is None and f.tag is not None and mine == f.fresh_default():
                continue  # kafka-python leaves an absent tagged struct as None
            if mine is None or other is None:
                assert mine is None and other is None, where
                continue
            if f.is_array:
                assert len(mine) == len(other), where
                for i, (a, b) in enumerate(zip(mine, other)):
                    n += assert_same(a, b, version, f"{where}[{i}]")
            else:
                n += assert_same(mine, other, version, where)
            continue
        n += 1
        if f.element_type == "uuid":
            conv = lambda u: bytes(16) if u is None else (u.bytes if isinstance(u, uuid.UUID) else bytes(u))
            other = [conv(x) for x in other] if f.is_array else conv(other)
        elif f.element_type in ("bytes", "records") and other is not None:
            other = [bytes(x) for x in other] if f.is_array else bytes(other)
        elif kname == "authorized_operations" and not isinstance(other, int):
            mine = _bits(mine)
            other = set(other) if other is not None else None
        assert mine == other, f"{where}: kinspect {mine!r} != kafka-python {other!r}"
    return n


_CFG = settings(max_examples=3, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name,version", PAIRS)
def test_generated_values_agree_with_kafka_python(name, version):
    spec = REG.messages[name]
    codec = REG.codec(spec)
    kcls = KP[name]

    @_CFG
    @given(message_values(spec, version))
    def check(value):
        _strip_unknown(value)
        if name == "ApiVersionsResponse":
            value.ErrorCode = 0
        body = codec.encode(value, version)
        theirs = _kp_decode(kcls, body, version)
        assert_same(value, theirs, version)
        assert theirs.encode(version=version) == body

    check()


# ---------------------------------------------------------------------------
# real traffic


async def test_real_traffic_agrees_with_kafka_python(tansu, unique):
    from proxyutil import bootstrap_of, codec, running_proxy

    from kinspect.workload import run_workload

    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        result = await asyncio.to_thread(run_workload, bootstrap_of(proxy), unique("diff-topic"),
                                         5, unique("diff-group"))
        assert result.produced == 5 and result.consumed == 5
    c = codec()
    seen = set()
    compared = 0
    for flow in rec.flows:
        if flow.request is None:
            continue
        name = c.api_name(flow.api_key)
        req = c.decode_request(flow.request)
        for direction, frame, msg in [("Request", flow.request, req)] + (
                [("Response", flow.response,
                  c.decode_response(flow.response, flow.api_key, flow.api_version))]
                if flow.response is not None else []):
            kcls = KP.get(name + direction)
            if kcls is None:
                continue
            body = frame[msg.body_offset:]
            version = getattr(msg, "body_version", msg.api_version)
            theirs = _kp_decode(kcls, body, version)
            compared += assert_same(msg.body, theirs, version)
            seen.add((name, direction, version))
    names = {n for n, _, _ in seen}
    assert {"ApiVersions", "Metadata", "Produce", "Fetch", "FindCoordinator", "JoinGroup",
            "SyncGroup", "OffsetCommit"} <= names, seen
    assert compared > 100
