"""Fuzzing the decoder with mutated realistic frames.

Seed frames are whole request/response frames (headers included, no size prefix):
hand-built realistic ones (Metadata, Produce with a real record batch, Fetch,
ApiVersions) plus hypothesis-generated messages of random APIs; with
``KINSPECT_FUZZ_CAPTURE=capture.jsonl[.gz]`` the frames of a real capture are added.
Each example applies a few mutations (byte flips, inserts, deletes, truncation,
huge lengths) and checks that decoding either succeeds, and then re-encoding and
decoding again is stable, or raises :class:`DecodeError` with its context. Any
other exception fails the test.

CI runs ``KINSPECT_FUZZ_EXAMPLES`` (default 300) examples; ``-m slow`` runs 20000.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random

import pytest
from codec_util import corpus_codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import message_values

from kinspect.codec import DecodeError, EncodeError

CODEC = corpus_codec()
REG = CODEC.registry


def _records(n: int) -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(n):
        b.append(timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * (i + 1),
                 headers=[])
    b.close()
    return bytes(b.buffer())


def _request(api_key: int, version: int, body, corr: int = 7, client_id: str = "fuzz") -> bytes:
    from kinspect.codec import Request

    hv = CODEC.request_header_version(api_key, version)
    req = Request(api_key, version, corr, client_id, hv, None, body, 0, "")
    return CODEC.encode_request(req)


def _response(api_key: int, version: int, body, corr: int = 7) -> bytes:
    from kinspect.codec import Response

    hv = CODEC.response_header_version(api_key, version)
    resp = Response(api_key, version, corr, hv, None, body, 0, "", version)
    return CODEC.encode_response(resp)


def _seeds() -> list[tuple[str, int, int, bytes]]:
    """(direction, api key, api version, frame)."""
    seeds = []
    md = REG.codec("MetadataResponse")
    T = md.spec.struct.field("Topics").struct
    P = T.field("Partitions").struct
    B = md.spec.struct.field("Brokers").struct
    for v in (1, 9, 12):
        body = md.cls(Brokers=[B.cls(NodeId=i, Host=f"broker{i}", Port=9092, Rack="r")
                               for i in range(2)], ClusterId="cid", ControllerId=1,
                      Topics=[T.cls(Name=f"topic{t}", TopicId=bytes([t + 1]) * 16 if v >= 10 else bytes(16),
                                    Partitions=[P.cls(PartitionIndex=p, LeaderId=p, LeaderEpoch=3,
                                                      ReplicaNodes=[0, 1], IsrNodes=[0, 1])
                                                for p in range(3)])
                              for t in range(2)])
        seeds.append(("resp", 3, v, _response(3, v, body)))
    pr = REG.codec("ProduceRequest")
    PT = pr.spec.struct.field("TopicData").struct
    PP = PT.field("PartitionData").struct
    for v in (3, 9):
        body = pr.cls(Acks=-1, TimeoutMs=1000, TopicData=[
            PT.cls(Name="t", PartitionData=[PP.cls(Index=0, Records=_records(3))])])
        seeds.append(("req", 0, v, _request(0, v, body)))
    fr = REG.codec("FetchResponse")
    FT = fr.spec.struct.field("Responses").struct
    FP = FT.field("Partitions").struct
    body = fr.cls(Responses=[FT.cls(Topic="t", Partitions=[
        FP.cls(PartitionIndex=0, HighWatermark=3, Records=_records(2))])])
    seeds.append(("resp", 1, 11, _response(1, 11, body)))
    seeds.append(("resp", 1, 12, _response(1, 12, body)))
    av = REG.codec("ApiVersionsResponse")
    AV = av.spec.struct.field("ApiKeys").struct
    body = av.cls(ApiKeys=[AV.cls(ApiKey=k, MinVersion=0, MaxVersion=k % 9) for k in range(20)])
    seeds.append(("resp", 18, 3, _response(18, 3, body)))
    seeds.append(("resp", 18, 0, _response(18, 0, body)))
    avr = REG.codec("ApiVersionsRequest")
    seeds.append(("req", 18, 3, _request(18, 3, avr.cls(ClientSoftwareName="k",
                                                        ClientSoftwareVersion="1"))))
    seeds.extend(_capture_seeds())
    return seeds


def _capture_seeds() -> list[tuple[str, int, int, bytes]]:
    path = os.environ.get("KINSPECT_FUZZ_CAPTURE")
    if not path:
        return []
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("type") != "frame" or d.get("api_key", -1) < 0:
                continue
            out.append((d["dir"], d["api_key"], d["api_version"], base64.b64decode(d["frame"])))
    return out


SEEDS = _seeds()


def _decode(direction: str, api_key: int, version: int, frame: bytes):
    if direction == "req":
        return CODEC.decode_request(frame)
    return CODEC.decode_response(frame, api_key, version)


def _scan(direction: str, api_key: int, version: int, frame: bytes):
    """Top-level tags by the scanner (responses), or the DecodeError it raised."""
    if direction != "resp":
        return None
    try:
        return CODEC.response_top_level_tags(frame, api_key, version)
    except DecodeError as e:
        return e


def _check(direction: str, api_key: int, version: int, frame: bytes) -> None:
    scanned = _scan(direction, api_key, version, frame)  # only DecodeError may escape
    try:
        msg = _decode(direction, api_key, version, frame)
    except DecodeError as e:
        assert e.offset is None or 0 <= e.offset <= len(frame), e
        assert e.reason
        str(e)
        e.to_dict()
        return
    # what decodes, the scanner walks too, to the same top-level tags
    if scanned is not None:
        assert not isinstance(scanned, DecodeError), scanned
        if msg.body is not None and msg.api_version == version:
            assert scanned == frozenset(msg.body.unknown_tags) | {
                f.tag for f in msg.body._spec.fields
                if f.tagged_in(version) and (getattr(msg.body, f.name) != f.fresh_default()
                                             or f.tag in (getattr(msg.body, "_present", None)
                                                          or ()))}
    # decoded: re-encoding gives bytes that decode to the same message (stable)
    try:
        again = CODEC.encode_request(msg) if direction == "req" else CODEC.encode_response(msg)
    except EncodeError as e:  # pragma: no cover - a decoded value must be encodable
        raise AssertionError(f"decoded value does not re-encode: {e}") from e
    msg2 = _decode(direction, msg.api_key, msg.api_version, again)
    assert msg2.body == msg.body and msg2.header == msg.header


@st.composite
def mutated(draw):
    direction, api_key, version, frame = draw(st.sampled_from(SEEDS))
    buf = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "huge",
                                   "varint"]))
        if not buf:
            break
        i = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            buf[i] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del buf[i:i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del buf[i:]
        elif op == "huge":
            buf[i:i + 4] = draw(st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe",
                                                 b"\x80\x00\x00\x00", b"\x00\x00\xff\xff"]))
        else:
            buf[i:i + 1] = draw(st.sampled_from([b"\xff\xff\xff\xff\x0f", b"\x80" * 6,
                                                 b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"]))
    return direction, api_key, version, bytes(buf)


_EXAMPLES = int(os.environ.get("KINSPECT_FUZZ_EXAMPLES", "300"))
_CFG = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


def test_seed_frames_decode_and_re_encode_identically():
    for direction, api_key, version, frame in SEEDS:
        msg = _decode(direction, api_key, version, frame)
        again = CODEC.encode_request(msg) if direction == "req" else CODEC.encode_response(msg)
        assert again == frame, (direction, api_key, version)


@settings(max_examples=_EXAMPLES, **_CFG)
@given(mutated())
def test_mutated_frames(case):
    _check(*case)


@pytest.mark.slow
@settings(max_examples=20000, **_CFG)
@given(mutated())
def test_mutated_frames_long(case):
    _check(*case)


@st.composite
def generated_frames(draw):
    """Frames of hypothesis-generated requests/responses of any api in the corpus."""
    key = draw(st.sampled_from(REG.api_keys()))
    direction = draw(st.sampled_from(["req", "resp"]))
    spec = REG.request(key) if direction == "req" else REG.response(key)
    version = draw(st.integers(spec.valid_versions.lowest, spec.valid_versions.highest))
    body = draw(message_values(spec, version))
    if key == 18 and direction == "resp" and version > 0 and body.ErrorCode == 35:
        body.ErrorCode = 0  # a v0 body would be expected for this error code
    frame = _request(key, version, body) if direction == "req" else _response(key, version, body)
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    buf = bytearray(frame)
    for _ in range(rnd.randint(0, 3)):
        if buf:
            i = rnd.randrange(len(buf))
            buf[i] = rnd.randrange(256)
    if rnd.random() < 0.3 and buf:
        del buf[rnd.randrange(len(buf)):]
    return direction, key, version, bytes(buf)


@settings(max_examples=_EXAMPLES, **_CFG)
@given(generated_frames())
def test_mutated_generated_frames(case):
    _check(*case)


@pytest.mark.slow
@settings(max_examples=20000, **_CFG)
@given(generated_frames())
def test_mutated_generated_frames_long(case):
    _check(*case)


@settings(max_examples=_EXAMPLES, **_CFG)
@given(st.binary(max_size=64), st.sampled_from(REG.api_keys()), st.integers(0, 20))
def test_random_bytes_as_response_bodies(data, api_key, version):
    spec = REG.response(api_key)
    if not spec.valid_versions.contains(version):
        version = spec.valid_versions.lowest
    try:
        REG.codec(spec).decode(data, version)
    except DecodeError as e:
        assert e.api == spec.name and e.version == version
