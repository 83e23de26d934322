"""Conformance: every message of Apache Kafka's spec corpus, at every valid version,
round-trips hypothesis-generated values (value -> bytes -> value, and
bytes -> value -> bytes), including unknown tagged fields at every struct level.

The corpus is read from ``$KINSPECT_KAFKA_SPECS`` (default:
``<repo>/../shared/kafka-message-specs``), folders ``message/`` and ``test-message/``.
kafka-python's bundled set (the runtime default, newer for client APIs) is checked
the same way.

CI runs a few examples per (message, version); ``-m slow`` runs many more.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import message_values

from kinspect.codec import DecodeError, SpecRegistry
from kinspect.codec.registry import kafka_python_specs

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("KINSPECT_KAFKA_SPECS", REPO.parent / "shared" / "kafka-message-specs"))


def _load(*dirs: Path) -> SpecRegistry:
    missing = [d for d in dirs if not d.is_dir()]
    if missing:  # fail loudly: the corpus is part of the test set-up
        raise FileNotFoundError(f"spec corpus folder(s) missing: {missing} "
                                f"(set KINSPECT_KAFKA_SPECS)")
    return SpecRegistry.load([str(d) for d in dirs], use_env=False, use_project=False,
                             use_default=False)


KAFKA = _load(CORPUS / "message", CORPUS / "test-message")
KP_DIR = kafka_python_specs()
KP = SpecRegistry.load([str(KP_DIR)], use_env=False, use_project=False, use_default=False) \
    if KP_DIR else None


def _pairs(reg: SpecRegistry, tag: str) -> list:
    out = []
    for name in sorted(reg.messages):
        spec = reg.messages[name]
        for v in range(spec.valid_versions.lowest, spec.valid_versions.highest + 1):
            out.append(pytest.param(reg, name, v, id=f"{tag}-{name}-v{v}"))
    return out


KAFKA_PAIRS = _pairs(KAFKA, "kafka")
KP_PAIRS = _pairs(KP, "kafka-python") if KP else []

_FAST = settings(max_examples=4, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))
_SLOW = settings(max_examples=50, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))


def test_corpus_is_complete():
    """The whole corpus loaded: 186 Kafka specs and the 4 generator test specs."""
    assert len(list((CORPUS / "message").glob("*.json"))) == 186
    assert len(KAFKA.messages) == 190
    for name in ("SimpleExampleMessage", "NullableStructMessage", "SimpleArraysMessage",
                 "SimpleRecordsMessage"):
        assert name in KAFKA.messages
    # every api key has both a request and a response
    for key in KAFKA.api_keys():
        assert KAFKA.request(key) is not None and KAFKA.response(key) is not None, key


def _check_round_trip(reg: SpecRegistry, name: str, version: int, value) -> None:
    codec = reg.codec(name)
    raw = codec.encode(value, version)
    back = codec.decode(raw, version)
    assert back == value
    # bytes -> value -> bytes
    assert codec.encode(back, version) == raw
    # the diagnostic (traced) decoder agrees with the fast one
    cv = codec.compiled(version)
    cv.traced(codec.spec, version)
    traced, end = cv.decode_traced(raw, 0, len(raw), [])
    assert end == len(raw) and traced == back
    out = bytearray()
    cv.encode_traced(back, out, [])
    assert bytes(out) == raw
    # plain dicts round-trip too
    assert codec.cls.from_dict(back.to_dict()) == back
    assert codec.encode(codec.cls.from_dict(back.to_dict()), version) == raw
    # ... and so do the dicts of the fields on the wire at the version
    at = back.to_dict(version)
    assert codec.cls.from_dict(at) == back
    assert codec.encode(codec.cls.from_dict(at), version) == raw
    for f in codec.spec.struct.fields:
        on_wire = f.versions.contains(version) and not (
            f.tagged_in(version) and getattr(back, f.name) == f.fresh_default()
            and f.tag not in (getattr(back, "_present", None) or ()))
        assert (f.name in at) == on_wire, (f.name, version)
    # the scanner (no objects built) finds the same end and top-level tags
    assert codec.top_level_tags(raw, version) == _top_level_tags(codec.spec, version, back)


def _top_level_tags(spec, version: int, value) -> frozenset[int]:
    """Oracle: the top-level tags a decoded value says were on the wire."""
    if not spec.is_flexible(version):
        return frozenset()
    present = getattr(value, "_present", None) or ()
    tags = set(value.unknown_tags)
    for f in spec.struct.fields:
        if f.tagged_in(version) and (getattr(value, f.name) != f.fresh_default()
                                     or f.tag in present):
            tags.add(f.tag)
    return frozenset(tags)


def _round_trip_test(reg: SpecRegistry, name: str, version: int, cfg: settings) -> None:
    spec = reg.messages[name]

    @cfg
    @given(message_values(spec, version))
    def check(value):
        _check_round_trip(reg, name, version, value)

    check()


@pytest.mark.parametrize("reg,name,version", KAFKA_PAIRS)
def test_kafka_corpus_round_trip(reg, name, version):
    _round_trip_test(reg, name, version, _FAST)


@pytest.mark.parametrize("reg,name,version", KP_PAIRS)
def test_kafka_python_set_round_trip(reg, name, version):
    _round_trip_test(reg, name, version, _FAST)


@pytest.mark.slow
@pytest.mark.parametrize("reg,name,version", KAFKA_PAIRS + KP_PAIRS)
def test_round_trip_long(reg, name, version):
    _round_trip_test(reg, name, version, _SLOW)


def test_unknown_tags_survive_at_every_level():
    """A hand-built value with unknown tags on the message, an array element and a
    nested struct comes back with the same tags in ascending order."""
    codec = KAFKA.codec("SimpleExampleMessage")
    spec = codec.spec
    v = 2
    value = codec.cls(myStruct=spec.struct.field("myStruct").struct.cls(
        structId=5,
        arrayInStruct=[spec.struct.field("myStruct").struct.field("arrayInStruct").struct.cls(
            arrayFieldId=9, unknown_tags={77: b"\x01\x02"})],
        unknown_tags={40: b"", 1000: b"xyz"}),
        unknown_tags={300: b"\xff", 12: b"ab"})
    raw = codec.encode(value, v)
    back = codec.decode(raw, v)
    assert back == value
    assert list(back.unknown_tags) == [12, 300]
    assert back.myStruct.unknown_tags == {40: b"", 1000: b"xyz"}
    assert back.myStruct.arrayInStruct[0].unknown_tags == {77: b"\x01\x02"}


@_FAST
@given(st.data())
def test_random_versions_of_random_messages(data):
    """One more draw across the corpus with the version itself drawn."""
    name = data.draw(st.sampled_from(sorted(KAFKA.messages)))
    spec = KAFKA.messages[name]
    version = data.draw(st.integers(spec.valid_versions.lowest, spec.valid_versions.highest))
    value = data.draw(message_values(spec, version))
    _check_round_trip(KAFKA, name, version, value)


def test_scanner_handles_structs_with_nothing_on_the_wire():
    """A struct whose fields all start in a later version takes no bytes: the
    scanner walks arrays and nullable fields of it (its loop bodies would be empty
    code) and agrees with the decoder."""
    from kinspect.codec.registry import MessageCodec
    from kinspect.codec.spec import parse_message_spec

    spec = parse_message_spec({
        "apiKey": 999, "type": "response", "name": "EmptyElementsResponse",
        "validVersions": "0-1", "flexibleVersions": "none",
        "fields": [
            {"name": "Items", "type": "[]Item", "versions": "0+",
             "fields": [{"name": "Later", "type": "int32", "versions": "1+"}]},
            {"name": "Maybe", "type": "Thing", "versions": "0+", "nullableVersions": "0+",
             "default": "null", "fields": [{"name": "Later", "type": "int32", "versions": "1+"}]},
        ]}, "test")
    codec = MessageCodec(spec)
    # one zero-byte item (a count is never allowed past the bytes left, as in Kafka's
    # generated readers), then Maybe present
    raw = b"\x00\x00\x00\x01" + b"\x01"
    assert len(codec.decode(raw, 0).Items) == 1
    assert codec.top_level_tags(raw, 0) == frozenset()
    with pytest.raises(DecodeError):
        codec.top_level_tags(raw + b"\x00", 0)
