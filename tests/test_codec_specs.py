"""Spec loading: invalid specs raise SpecError naming the file and the field, and
parsed documents are cached (json5 is slow) safely across processes."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import json5
import pytest
from codec_util import CORPUS, inline

from kinspect.codec import SpecError, SpecRegistry
from kinspect.codec import registry as registry_mod
from kinspect.codec import spec as spec_mod
from kinspect.codec.versions import Versions


def _msg(fields, **top):
    doc = {"name": "BadRequest", "type": "request", "apiKey": 99, "validVersions": "0-3",
           "flexibleVersions": "2+", "fields": fields}
    doc.update(top)
    return doc


def _f(name="F", type="int32", versions="0+", **kw):
    return {"name": name, "type": type, "versions": versions, **kw}


INVALID = [
    # (document, field path or None, words in the reason)
    (_msg([_f()], type="requestx"), None, "invalid message type"),
    (_msg([_f()], apiKey=None), None, "apiKey"),
    (_msg([_f()], validVersions="3-1"), None, "validVersions"),
    (_msg([_f()], flexibleVersions=None), None, "flexibleVersions"),
    (_msg([_f()], name="1Bad"), None, "message name"),
    (_msg([_f()], extra=1), None, "unknown property extra"),
    (_msg([_f(nullable=True)]), "F", "unknown property nullable"),
    (_msg([_f(name="1x")]), "1x", "invalid field name"),
    (_msg([_f(), _f()]), "F", "duplicate field name"),
    (_msg([_f("A", tag=1, taggedVersions="2+"), _f("B", tag=1, taggedVersions="2+")]), "B",
     "tag 1 used by both"),
    (_msg([_f(tag=1)]), "F", "go together"),
    (_msg([_f(tag=1, taggedVersions="2-3")]), "F", "open-ended"),
    (_msg([_f(tag=1, taggedVersions="1+")]), "F", "non-flexible"),
    (_msg([_f(tag=-1, taggedVersions="2+")]), "F", "invalid tag"),
    (_msg([_f(nullableVersions="0+")]), "F", "cannot be nullable"),
    (_msg([_f(type="bool", nullableVersions="0+")]), "F", "cannot be nullable"),
    (_msg([_f(type="NoSuchStruct")]), "F", "unknown struct type"),
    (_msg([_f(type="[]records")]), "F", "arrays of records"),
    (_msg([_f(type="string", zeroCopy=True)]), "F", "zeroCopy"),
    (_msg([_f(flexibleVersions="none")]), "F", "field-level flexibleVersions"),
    (_msg([_f(fields=[_f("G")])]), "F", "cannot have sub-fields"),
    (_msg([_f(versions="x+")]), "F", "versions"),
    (_msg([_f(versions=None)]), "F", "missing versions"),
    (_msg([_f(ignorable="maybe")]), "F", "ignorable must be a boolean"),
    (_msg([_f(type="string", default="null")]), "F", "null default"),
    (_msg([_f(type="int8", default="300")]), "F", "invalid default"),
    (_msg([_f(type="[]T", fields=[_f("A", type="int8", nullableVersions="1+")])]), "F.A",
     "cannot be nullable"),
    (_msg([_f("A", type="T", fields=[_f("X")]), _f("B", type="T", fields=[_f("Y")])]), "B",
     "defined twice"),
    (_msg([_f(type="C")], commonStructs=[{"name": "C", "versions": "0+",
                                          "fields": [_f("X", type="C")]}]), "C.X",
     "refers to itself"),
    (_msg([_f()], commonStructs=[{"name": "C", "versions": "0+",
                                  "fields": [_f("X", type="int8", default="x")]}]), "C.X",
     "invalid default"),
    (_msg([_f(type="C")], commonStructs=[
        {"name": "C", "versions": "0+", "fields": [_f("X", type="D")]},
        {"name": "D", "versions": "0+", "fields": [_f("Y", type="[]C")]}]), "D.Y",
     "refers to itself"),
    # rules of Kafka's generator (generator/src/main/java/org/apache/kafka/message/)
    # MessageDataGenerator.generate: "does not specify a maximum version"
    (_msg([_f()], validVersions="0+"), None, "no maximum version"),
    # MessageSpec: flexibleVersions "must be either none, or an open-ended range"
    (_msg([_f()], flexibleVersions="2-3"), None, "open-ended"),
    # MessageSpec: listeners and latestVersionUnstable only for requests
    (_msg([_f()], type="response", listeners=["broker"]), None, "only valid"),
    (_msg([_f()], type="response", latestVersionUnstable=True), None, "only valid"),
    # FieldSpec.VALID_FIELD_NAMES: [A-Za-z]([A-Za-z0-9]*)
    (_msg([_f(name="Topic_Name")]), "Topic_Name", "invalid field name"),
    # FieldType.parse and StructRegistry.register: struct names start with a capital
    (_msg([_f(type="lowerStruct", fields=[_f("X")])]), "F", "capital letter"),
    (_msg([_f(type="[]lowerStruct", fields=[_f("X")])]), "F", "capital letter"),
    (_msg([_f()], commonStructs=[{"name": "cs", "versions": "0+", "fields": [_f("X")]}]),
     "cs", "capital letter"),
    # FieldSpec.checkTagInvariants: all tagged versions nullable, or none
    (_msg([_f(type="string", tag=0, taggedVersions="2+", nullableVersions="3+")]), "F",
     "either all tagged versions are nullable or none"),
    # FieldSpec: "Tagged fields cannot be used as keys."
    (_msg([_f("A", type="[]S", fields=[_f("K", tag=0, taggedVersions="2+", mapKey=True)])]),
     "A.K", "mapKey"),
    # MessageDataGenerator: "Unsupported attempt to declare field ... with records type
    # as a tagged field"
    (_msg([_f(type="records", nullableVersions="0+", tag=0, taggedVersions="2+")]), "F",
     "records field cannot be tagged"),
    # MessageDataGenerator.generateClassReader: taggedVersions within the field's
    # flexible versions, all of them (not only the valid ones: 4+ here)
    (_msg([_f(type="string", tag=0, taggedVersions="4+")], flexibleVersions="none"), "F",
     "non-flexible"),
    (_msg([_f(type="string", tag=0, taggedVersions="2+", flexibleVersions="3+")]), "F",
     "non-flexible"),
    # FieldSpec.validateNullDefault: nullableVersions contains the field's versions, as
    # written (0+ here, though only 0-3 are valid; and the untagged ones too)
    (_msg([_f(type="string", nullableVersions="0-3", default="null")]), "F", "null default"),
    (_msg([_f(type="string", tag=0, taggedVersions="2+", nullableVersions="2+",
              default="null")]), "F", "null default"),
    # MessageDataGenerator.generateClass: "Cannot set mapKey on top level fields."
    (_msg([_f(mapKey=True)]), "F", "top-level"),
    # EntityType: a known entity type, of a matching type (or an array of it)
    (_msg([_f(type="int32", entityType="topicName")]), "F", "entityType topicName needs"),
    (_msg([_f(type="[]int64", entityType="brokerId")]), "F", "entityType brokerId needs"),
    (_msg([_f(type="string", entityType="topicId")]), "F", "unknown entityType"),
    # JSON of the wrong shape: TypeError or ValueError tracebacks once
    (_msg([_f()], commonStructs=5), None, "'commonStructs' must be a list"),
    (_msg([_f()], commonStructs={"name": "C"}), None, "'commonStructs' must be a list"),
    (_msg([_f(type="string", entityType=["topicName"])]), "F", "unknown entityType"),
    (_msg([_f(type="string", entityType={"topicName": 1})]), "F", "unknown entityType"),
    (_msg([_f(tag="\u00b2", taggedVersions="2+")]), "F", "invalid tag"),  # "²".isdigit()
    (_msg([_f(tag="9" * 5000, taggedVersions="2+")]), "F", "invalid tag"),
    # a version given as a JSON number is an int16 too, as the same number as a string
    (_msg([_f()], validVersions=100000), None, "out of range 0..32767"),
    (_msg([_f()], validVersions=-3), None, "out of range 0..32767"),
    (_msg([_f()], flexibleVersions=-3), None, "out of range 0..32767"),
    (_msg([_f(versions=-1)]), "F", "out of range 0..32767"),
    (_msg([_f()], validVersions=True), None, "not a string or an integer"),
    (_msg([_f()], deprecatedVersions={"x": 1}), None, "not a string or an integer"),
    # Kafka's MessageSpec and FieldSpec read these as a list of names, a boolean and a
    # string (Jackson turns "true" into a boolean, not "yes"; an object into no string)
    (_msg([_f()], listeners={"a": 1}), None, "'listeners' must be a list of names"),
    (_msg([_f()], listeners=["broker", 1]), None, "'listeners' must be a list of names"),
    (_msg([_f()], latestVersionUnstable="yes"), None, "latestVersionUnstable must be a boolean"),
    (_msg([_f(about={"a": [1]})]), "F", "about must be a string"),
    (_msg([_f(about=3)]), "F", "about must be a string"),
]


@pytest.mark.parametrize("doc,field,why", INVALID)
def test_invalid_specs_name_file_and_field(doc, field, why):
    with pytest.raises(SpecError) as ei:
        inline(doc, source="specs/BadRequest.json")
    e = ei.value
    assert e.source == "specs/BadRequest.json"
    assert e.field == field, e
    if why:
        assert why in e.reason, e
    assert str(e).startswith("specs/BadRequest.json")


def test_entity_types_and_open_ended_flexible_versions_kafka_accepts():
    """The valid counterparts of the cases above: entity types on their type or an
    array of it, ``unknown`` on anything, flexibleVersions none, and a null default
    nullable in every version of a tagged field."""
    c = inline(_msg([_f("A", type="[]string", entityType="topicName"),
                     _f("B", type="int64", entityType="producerId"),
                     _f("C", type="bool", entityType="unknown"),
                     _f("D", type="string", versions="2+", tag=0, taggedVersions="2+",
                        nullableVersions="2+", default="null")], flexibleVersions="2+"))
    assert c.spec.fields[0].entity_type == "topicName"
    assert c.spec.fields[3].default is None
    inline(_msg([_f()], flexibleVersions="none"))
    # listeners, latestVersionUnstable (as Jackson reads "true") and about as Kafka has them
    inline(_msg([_f(about=None)], listeners=["broker", "controller"],
                latestVersionUnstable="true"))


@pytest.mark.parametrize("number", [-3, -1, 0, 7, 32767, 32768, 100000])
def test_versions_as_json_numbers_read_as_the_same_number_as_a_string(number):
    """``Versions.parse`` took an int as it was, out of the int16 range or not, where
    the same number as a string is range-checked."""
    try:
        want = Versions.parse(str(number))
    except ValueError:
        with pytest.raises(ValueError, match="out of range 0..32767"):
            Versions.parse(number)
    else:
        assert Versions.parse(number) == want


@pytest.mark.parametrize("text", ["1_0+", "0 - 2", "0-1_0", "0 +", "+5", "٣", "1e1", ""])
def test_version_numbers_are_plain_digits(text):
    """Version numbers are ASCII digits. Kafka's generator reads them with
    ``Short.parseShort``, which takes no "_" separators and no spaces inside the range;
    Python's ``int()`` takes both: "1_0+" was read as 10+. (kinspect is stricter than
    parseShort about a "+" sign and non-ASCII digits: no spec writes them.)"""
    with pytest.raises(ValueError, match="invalid version range"):
        Versions.parse(text)
    assert Versions.parse(" 3-10 ") == Versions(3, 10)  # the whole text may be padded


def test_json_shapes_kafka_accepts():
    """The valid counterparts of the shapes above: versions and a tag as JSON numbers,
    a tag as a string of digits, a null commonStructs."""
    c = inline(_msg([_f(versions=3), _f("T", type="string", tag="3", taggedVersions="2+")],
                    validVersions=3, commonStructs=None))
    assert c.spec.valid_versions == c.spec.fields[0].versions == Versions(3, 3)
    assert c.spec.fields[1].tag == 3


def test_json_syntax_errors_name_the_file():
    reg = SpecRegistry()
    with pytest.raises(SpecError) as ei:
        reg.add_text('{"name": "X", ', "broken.json")
    assert ei.value.source == "broken.json" and "not valid JSON" in ei.value.reason


def test_comments_and_json5_syntax_are_accepted():
    c = inline("""// licence header
    { "name": "Tiny", "type": "data", "validVersions": "0", "flexibleVersions": "none",
      // a comment between fields
      "fields": [ { "name": "A", "type": "int8", "versions": "0+", }, ] }""")
    assert c.decode(b"\x05", 0).A == 5


def test_a_bad_spec_directory_file_is_reported(tmp_path):
    (tmp_path / "Good.json").write_text(json.dumps(
        {"name": "Good", "type": "data", "validVersions": "0", "flexibleVersions": "none",
         "fields": [_f("A", type="int8")]}))
    (tmp_path / "Bad.json").write_text(json.dumps(_msg([_f(type="Nope")])))
    with pytest.raises(SpecError) as ei:
        SpecRegistry.load([str(tmp_path)], use_env=False, use_project=False, use_default=False)
    assert ei.value.source == str(tmp_path / "Bad.json") and ei.value.field == "F"


def test_not_a_spec_path():
    with pytest.raises(SpecError):
        SpecRegistry.load(["/nonexistent/specs"], use_env=False, use_project=False,
                          use_default=False)


@pytest.mark.parametrize("origin", ["--specs", "KINSPECT_SPECS"])
def test_a_bad_spec_path_names_where_it_came_from(origin, tmp_path, monkeypatch):
    """A path that is neither a directory nor an archive says whether it was given
    with --specs or came from KINSPECT_SPECS: a stale variable is otherwise hard to
    find, since the command line never named the path."""
    missing = str(tmp_path / "missing")
    monkeypatch.setenv("KINSPECT_SPECS", missing if origin == "KINSPECT_SPECS" else "")
    with pytest.raises(SpecError) as ei:
        SpecRegistry.load([missing] if origin == "--specs" else [], use_project=False,
                          use_default=False)
    assert ei.value.source == missing
    assert ei.value.reason.startswith(f"{origin} path "), ei.value


# ---------------------------------------------------------------------------
# hostile specs: bounded work, a SpecError instead of a traceback


def _chain(depth: int, *, width: int = 1, array: bool = False) -> dict:
    """A request whose field Root is common struct S0, S0 has ``width`` fields of
    type S1 (``[]S1`` with ``array``), and so on down to S{depth-1}."""
    common = []
    for i in range(depth):
        if i + 1 < depth:
            fields = [_f(chr(65 + j), type=("[]" if array else "") + f"S{i + 1}")
                      for j in range(width)]
        else:
            fields = [_f("X", type="int8")]
        common.append({"name": f"S{i}", "versions": "0+", "fields": fields})
    return _msg([_f("Root", type="S0")], commonStructs=common)


def test_common_structs_used_twice_at_every_level_are_refused():
    """10 common structs, each with four fields of the next: a 2 KB spec whose default
    value holds 4**9 structs and whose compiled code grows as fast (26 structs of two
    such fields took minutes and gigabytes on the first frame of their api). Refused
    at load."""
    spec_text = json.dumps(_chain(10, width=4))
    assert len(spec_text) < 3000
    with pytest.raises(SpecError) as ei:
        inline(spec_text, source="specs/BadRequest.json")
    assert "written out where they are used" in ei.value.reason, ei.value
    assert str(spec_mod.MAX_EXPANDED_FIELDS) in ei.value.reason


def test_structs_nested_too_deep_are_refused():
    """Struct chains deeper than MAX_STRUCT_DEPTH: 40 nested arrays (generated code the
    Python compiler refuses: a SyntaxError on the first frame) and 400 nested structs
    (a RecursionError while loading) are SpecErrors at load."""
    for depth, array in ((40, True), (400, False)):
        with pytest.raises(SpecError) as ei:
            inline(_chain(depth, array=array), source="specs/BadRequest.json")
        assert "nested" in ei.value.reason, ei.value
        assert ei.value.source == "specs/BadRequest.json"


def test_structs_at_the_limits_still_compile_and_decode():
    """The limits are below what the compiler handles: a chain of arrays as deep as
    allowed compiles and decodes, and so does a struct used twice at a few levels."""
    c = inline(_chain(spec_mod.MAX_STRUCT_DEPTH - 1, array=True))  # + the top level
    assert c.decode(b"\x00\x00\x00\x00", 0).Root.A == []
    c = inline(_chain(6, width=2))  # 2 + 4 + ... + 64 + 1 fields
    v = c.decode(bytes(32), 0)
    assert v.Root.B.A.B.A.B.X == 0


def test_deeply_nested_json_is_a_spec_error(monkeypatch):
    """json5's parser recurses for every nested value: a file of nested arrays was a
    RecursionError traceback for every command that loads specs. (Nested deeper than
    any recursion limit a test may have left raised, and past the parse cache, which
    holds whatever a process with a higher limit once parsed.)"""
    monkeypatch.setenv(registry_mod.CACHE_ENV_VAR, "off")
    with pytest.raises(SpecError) as ei:
        SpecRegistry().add_text("[" * 100_000 + "]" * 100_000, "specs/Deep.json")
    assert ei.value.source == "specs/Deep.json" and "nested too deeply" in ei.value.reason


def test_a_spec_file_that_is_not_utf8_names_the_file(tmp_path):
    (tmp_path / "Bad.json").write_bytes(b'{"name": "Bad\xff"}')
    with pytest.raises(SpecError) as ei:
        SpecRegistry.load([str(tmp_path)], use_env=False, use_project=False, use_default=False)
    assert ei.value.source == str(tmp_path / "Bad.json") and "UTF-8" in ei.value.reason


def test_an_archive_member_larger_than_a_spec_file_is_refused(tmp_path):
    """A jar member that inflates past MAX_ARCHIVE_SPEC_BYTES (a few KB of deflate
    can hold megabytes) is refused before it is read."""
    jar = tmp_path / "specs.jar"
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("common/message/Big.json",
                    " " * (registry_mod.MAX_ARCHIVE_SPEC_BYTES + 1) + "{}")
    assert jar.stat().st_size < 64 << 10
    with pytest.raises(SpecError) as ei:
        SpecRegistry.load([str(jar)], use_env=False, use_project=False, use_default=False)
    assert ei.value.source == f"{jar}!common/message/Big.json"
    assert "decompressed" in ei.value.reason


_SPEC_MEMBER = "common/message/Tiny.json"


def _jar(path: Path, method: int = zipfile.ZIP_DEFLATED) -> bytearray:
    """A jar of one valid spec, ``_SPEC_MEMBER``, written to ``path``; returns its
    bytes for a test to damage and write back."""
    doc = {"name": "Tiny", "type": "data", "validVersions": "0", "flexibleVersions": "none",
           "fields": [_f("A", type="int8")]}
    with zipfile.ZipFile(path, "w", method) as zf:
        zf.writestr(_SPEC_MEMBER, json.dumps(doc))
    return bytearray(path.read_bytes())


def _set_headers(data: bytearray, offset: int, value: int) -> None:
    """Write the 16-bit ``value`` at ``offset`` of the local header (after its 4-byte
    signature) and the same field of the central directory entry, two bytes further
    on (it has "version made by" first)."""
    local = data.index(b"PK\x03\x04") + 4
    central = data.index(b"PK\x01\x02") + 6
    struct.pack_into("<H", data, local + offset, value)
    struct.pack_into("<H", data, central + offset, value)


def _member_data(data: bytearray) -> int:
    """Offset of the one member's data, past its local header."""
    name_len, extra_len = struct.unpack_from("<HH", data, 26)
    return 30 + name_len + extra_len


def _bad_crc(data):  # a stored member whose text changed after its CRC was written
    data[_member_data(data)] ^= 0x20


def _bad_deflate(data):  # BTYPE 11, a reserved block type
    data[_member_data(data)] = 0xFF


def _encrypted(data):  # general purpose flag bit 0
    _set_headers(data, 2, 0x1)


def _method_99(data):  # compression method: AE-x (WinZip AES), which zipfile lacks
    _set_headers(data, 4, 99)


def _eocd_only(data):  # only an end of central directory record, its offsets bogus
    data[:] = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, 0x0FFFFFFF, 0, 0)


@pytest.mark.parametrize("damage,method,member,why", [
    # (damage, how the member is written, whether the error names it, words in the
    # reason); what zipfile raised once is in the comment
    (_bad_crc, zipfile.ZIP_STORED, True, "Bad CRC-32"),  # BadZipFile
    (_bad_deflate, zipfile.ZIP_DEFLATED, True, "damaged archive member"),  # zlib.error
    (_encrypted, zipfile.ZIP_DEFLATED, True, "encrypted"),  # RuntimeError
    (_method_99, zipfile.ZIP_DEFLATED, True, "method 99"),  # NotImplementedError
    (_eocd_only, zipfile.ZIP_STORED, False, "not a readable jar/zip archive"),  # BadZipFile
])
def test_a_damaged_archive_is_a_spec_error_naming_it(tmp_path, damage, method, member, why):
    """Archives that zipfile opens or lists but cannot read raised its own exceptions
    (BadZipFile, zlib.error, RuntimeError, NotImplementedError) from every command
    that loads specs."""
    jar = tmp_path / "specs.jar"
    data = _jar(jar, method)
    assert SpecRegistry.load([str(jar)], use_env=False, use_project=False,
                             use_default=False).messages.keys() == {"Tiny"}
    damage(data)
    jar.write_bytes(data)
    with pytest.raises(SpecError) as ei:
        SpecRegistry.load([str(jar)], use_env=False, use_project=False, use_default=False)
    assert ei.value.source == (f"{jar}!{_SPEC_MEMBER}" if member else str(jar)), ei.value
    assert why in ei.value.reason, ei.value


# ---------------------------------------------------------------------------
# the parsed-document cache


@pytest.fixture
def counting_json5(monkeypatch):
    calls = []
    real = json5.loads

    def loads(text, *a, **kw):
        calls.append(len(text))
        return real(text, *a, **kw)

    monkeypatch.setattr(registry_mod.json5, "loads", loads)
    return calls


def _load_corpus():
    return SpecRegistry.load([str(CORPUS / "test-message")], use_env=False, use_project=False,
                             use_default=False)


def _cache_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_cache_avoids_reparsing(tmp_path, monkeypatch, counting_json5):
    monkeypatch.setenv("KINSPECT_CACHE", str(tmp_path / "cache"))
    first = _load_corpus()
    assert len(counting_json5) == 4
    files = _cache_files(tmp_path / "cache")
    assert len(files) == 4 and all(p.suffix == ".json" for p in files)
    assert not [p for p in files if p.name.startswith(".tmp")]
    second = _load_corpus()
    assert len(counting_json5) == 4  # all from the cache
    for name, spec in first.messages.items():
        other = second.messages[name]
        assert spec.valid_versions == other.valid_versions
        assert [f.name for f in spec.fields] == [f.name for f in other.fields]
    c = second.codec("SimpleExampleMessage")
    assert c.decode(c.encode(c.cls(myInt16=7), 2), 2).myInt16 == 7


def test_cache_is_keyed_by_content(tmp_path, monkeypatch, counting_json5):
    monkeypatch.setenv("KINSPECT_CACHE", str(tmp_path / "cache"))
    text = json.dumps({"name": "K", "type": "data", "validVersions": "0",
                       "flexibleVersions": "none", "fields": [_f("A", type="int8")]})
    d1 = registry_mod.load_spec_document(text, "a.json")
    d2 = registry_mod.load_spec_document(text, "b.json")  # same text, other file: cached
    assert d1 == d2 and len(counting_json5) == 1
    registry_mod.load_spec_document(text.replace("int8", "int16"), "a.json")
    assert len(counting_json5) == 2


def test_corrupt_cache_entries_are_ignored_and_rewritten(tmp_path, monkeypatch, counting_json5):
    monkeypatch.setenv("KINSPECT_CACHE", str(tmp_path / "cache"))
    _load_corpus()
    for p in _cache_files(tmp_path / "cache"):
        p.write_text('{"torn": ')
    reg = _load_corpus()
    assert len(counting_json5) == 8 and "NullableStructMessage" in reg.messages
    for p in _cache_files(tmp_path / "cache"):
        assert isinstance(json.loads(p.read_text()), dict)


def test_cache_can_be_turned_off(tmp_path, monkeypatch, counting_json5):
    monkeypatch.setenv("KINSPECT_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _load_corpus()
    _load_corpus()
    assert len(counting_json5) == 8
    assert registry_mod.cache_dir() is None
    assert not (tmp_path / ".cache").exists()


def test_default_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("KINSPECT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry_mod.cache_dir() == tmp_path / "xdg" / "kinspect"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert registry_mod.cache_dir() == tmp_path / ".cache" / "kinspect"


def test_unwritable_cache_still_loads(tmp_path, monkeypatch, counting_json5):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KINSPECT_CACHE", str(blocker / "cache"))
    reg = _load_corpus()
    assert len(reg.messages) == 4 and len(counting_json5) == 4


def test_concurrent_processes_share_the_cache(tmp_path):
    """Processes loading the same specs at once all succeed and leave complete entries."""
    env = {**os.environ, "KINSPECT_CACHE": str(tmp_path / "cache")}
    code = ("from kinspect.codec import SpecRegistry; import sys; "
            "r = SpecRegistry.load([sys.argv[1]], use_env=False, use_project=False, "
            "use_default=False); print(len(r.messages))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(CORPUS / "message")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert all(o.strip() == "186" for o, _ in outs)
    files = _cache_files(tmp_path / "cache")
    assert len(files) == 186
    for p in files:
        json.loads(p.read_text())


def test_a_wheel_ships_the_project_specs_and_an_installed_kinspect_finds_them(tmp_path):
    """The project's own specs (specs/: the KIP-714 telemetry APIs, which the default
    kafka-python set lacks) are in the wheel as kinspect/_specs, and a kinspect
    imported from the unpacked wheel, away from this checkout, puts them on its spec
    search path and knows those APIs. Builds the wheel with pip (build isolation:
    setuptools comes from the package index) from a copy of the sources, without
    the checkout's build/ directory, whose leftovers pip would reuse."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", "node_modules", "captures", "*.so",
        ".pytest_cache", ".hypothesis"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
         "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = (tmp_path / "dist").glob("kinspect-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    ours = sorted(p.name for p in (root / "specs").glob("*.json"))
    assert ours and {f"kinspect/_specs/{n}" for n in ours} <= names
    probe = ("import json, kinspect\n"
             "from kinspect.codec import Codec\n"
             "from kinspect.codec.registry import search_path\n"
             "c = Codec()\n"
             "print(json.dumps([kinspect.__file__, [[s.path, s.origin] for s in search_path()],"
             " c.api_name(71), c.api_name(72)]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KINSPECT_SPECS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    where, sources, api71, api72 = json.loads(out.stdout)
    assert Path(where).is_relative_to(tmp_path / "site")
    project = [p for p, origin in sources if origin == "project"]
    assert project == [str((tmp_path / "site" / "kinspect" / "_specs").resolve())]
    assert (api71, api72) == ("GetTelemetrySubscriptions", "PushTelemetry")
