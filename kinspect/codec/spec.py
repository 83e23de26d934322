"""The message-definition format: parse and validate Kafka's JSON message specs.

The model follows Apache Kafka's generator (``MessageSpec``, ``FieldSpec``,
``StructRegistry``) and the rules in ``clients/src/main/resources/common/message/
README.md``. Everything is validated at load time; an invalid spec raises
:class:`~kinspect.codec.errors.SpecError` naming the file and the field.

Beyond Kafka's format, fields of type int16/int32/int64 accept the proposed
``"encoding"`` property: a string or a map of version ranges to one of
``fixedN`` (big-endian two's complement, the default), ``packedN`` (zig-zag
varint) or ``upackedN`` (unsigned varint), where N is the field's width.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Iterator

from .errors import SpecError
from .versions import ALL, NONE, Versions

PRIMITIVES = (
    "bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64",
    "string", "uuid", "bytes", "records",
)
INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
NULLABLE_TYPES = ("string", "bytes", "records")
ENCODABLE_WIDTH = {"int16": 16, "int32": 32, "int64": 64}
ENCODING_KINDS = ("fixed", "packed", "upacked")
MESSAGE_TYPES = ("request", "response", "header", "data", "metadata",
                 "coordinator-key", "coordinator-value")

_MESSAGE_KEYS = {"name", "type", "apiKey", "validVersions", "flexibleVersions", "fields",
                 "commonStructs", "listeners", "latestVersionUnstable", "deprecatedVersions"}
_FIELD_KEYS = {"name", "type", "versions", "about", "fields", "default", "entityType",
               "ignorable", "nullableVersions", "mapKey", "taggedVersions", "tag", "zeroCopy",
               "flexibleVersions", "encoding"}
_COMMON_KEYS = {"name", "versions", "fields"}
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: field names as Kafka's generator takes them (``FieldSpec.VALID_FIELD_NAMES``)
_FIELD_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
#: a ``tag`` written as a string: ASCII digits only (``str.isdigit`` also takes
#: ``"²"``, which ``int`` refuses), few enough for an int32
_TAG_TEXT_RE = re.compile(r"[0-9]{1,10}")
#: ``entityType`` values (Kafka's generator ``EntityType``) and the type each applies to
#: (to the elements of an array); ``unknown`` applies to any type
ENTITY_TYPES = {"unknown": None, "transactionalId": "string", "producerId": "int64",
                "groupId": "string", "topicName": "string", "brokerId": "int32"}
_ZERO_UUID = bytes(16)
#: deepest nesting of structs in a message, the top level counting as 1 (Kafka's own
#: specs nest 4 deep at most); deeper ones would overflow the parser's recursion and
#: the nested blocks of the code the compiler generates
MAX_STRUCT_DEPTH = 16
#: most fields a message may have once every struct is counted where it is used (a
#: common struct used twice counts twice; Kafka's largest message has 31): what the
#: compiler generates code for, and how many structs a default value holds, so a
#: small spec of common structs that use each other twice over cannot cost
#: exponential time and memory
MAX_EXPANDED_FIELDS = 10_000


@dataclass(eq=False)
class StructSpec:
    """A struct: the top level of a message, an array element type, a struct field or
    a common struct.

    Attributes:
        name: the struct's type name (``"MetadataResponseTopic"``).
        versions: versions in which the struct exists.
        fields: fields in wire order.
        message: the owning :class:`MessageSpec` (set after parsing).
    """

    name: str
    versions: Versions
    fields: list["FieldSpec"]
    message: "MessageSpec | None" = None
    #: filled by the compiler: the Python class of decoded values.
    cls: Any = None

    def field(self, name: str) -> "FieldSpec":
        """The field named ``name``.

        Raises:
            KeyError: the struct has no such field.
        """
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def field_names(self) -> list[str]:
        """The field names, in spec order."""
        return [f.name for f in self.fields]


@dataclass(eq=False)
class FieldSpec:
    """One field of a struct, as written in the spec plus derived facts.

    ``default`` holds the parsed default (``None`` for ``"null"``); arrays default to
    empty, structs to a struct of defaults (or ``None`` when the default is null).
    ``encodings`` is ``None`` or a list of ``(Versions, kind)`` with kind in
    :data:`ENCODING_KINDS`.
    """

    name: str
    type: str
    versions: Versions
    nullable_versions: Versions = NONE
    tagged_versions: Versions = NONE
    tag: int | None = None
    flexible_versions: Versions | None = None
    default: Any = None
    default_text: str | None = None
    ignorable: bool = False
    map_key: bool = False
    entity_type: str | None = None
    about: str = ""
    zero_copy: bool = False
    encodings: list[tuple[Versions, str]] | None = None
    struct: StructSpec | None = None
    path: str = ""

    @property
    def is_array(self) -> bool:
        """An array type (``[]T``)."""
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        """The element type of an array, or the field's own type."""
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        """A (non-array) struct field."""
        return not self.is_array and self.struct is not None

    @property
    def is_struct_array(self) -> bool:
        """An array of structs."""
        return self.is_array and self.struct is not None

    @property
    def is_tagged(self) -> bool:
        """A tagged field (KIP-482: it has a ``tag``)."""
        return self.tag is not None

    def nullable_in(self, version: int) -> bool:
        """The field may be null at ``version`` (``nullableVersions``; KIP-893 for structs)."""
        return self.nullable_versions.contains(version)

    def tagged_in(self, version: int) -> bool:
        """The field is a tagged field at ``version`` (``taggedVersions``, KIP-482): it
        travels in its struct's tag section, not in the fixed part."""
        return self.tag is not None and self.tagged_versions.contains(version)

    def encoding_in(self, version: int) -> str:
        """``"fixed"``, ``"packed"`` or ``"upacked"`` for an int field at a version."""
        if self.encodings:
            for rng, kind in self.encodings:
                if rng.contains(version):
                    return kind
        return "fixed"

    def fresh_default(self) -> Any:
        """A new default value (a new list for arrays, a new struct for structs)."""
        if self.is_array:
            return None if self.default_text == "null" else []
        if self.struct is not None:
            if self.default_text == "null":
                return None
            return self.struct.cls()  # (not .defaults(): a field may be named so)
        return self.default


@dataclass(eq=False)
class MessageSpec:
    """A whole message spec file.

    Attributes:
        name: ``"MetadataResponse"``.
        type: one of :data:`MESSAGE_TYPES`.
        api_key: the api key for requests and responses, else ``None``.
        valid_versions, flexible_versions: as in the file.
        struct: the top-level struct (named like the message).
        common_structs: name → struct.
        source: where the file came from (path, or ``archive!member``).
    """

    name: str
    type: str
    api_key: int | None
    valid_versions: Versions
    flexible_versions: Versions
    struct: StructSpec
    common_structs: dict[str, StructSpec]
    source: str
    listeners: list[str] = dc_field(default_factory=list)
    latest_version_unstable: bool = False
    deprecated_versions: Versions = NONE

    @property
    def fields(self) -> list[FieldSpec]:
        """The top-level fields (those of :attr:`struct`)."""
        return self.struct.fields

    def structs(self) -> Iterator[StructSpec]:
        """Every struct of the message, top level first, each once."""
        seen: set[int] = set()
        stack = [self.struct]
        while stack:
            s = stack.pop(0)
            if id(s) in seen:
                continue
            seen.add(id(s))
            yield s
            stack.extend(f.struct for f in s.fields if f.struct is not None)

    def is_flexible(self, version: int) -> bool:
        """``version`` is a flexible version (KIP-482: compact types, tag sections,
        request header v2 / response header v1)."""
        return self.flexible_versions.contains(version)


# ---------------------------------------------------------------------------
# parsing


def parse_message_spec(doc: Any, source: str) -> MessageSpec:
    """Build a validated :class:`MessageSpec` from a parsed JSON document.

    Raises:
        SpecError: naming ``source`` and the offending field; also for structs nested
            more than :data:`MAX_STRUCT_DEPTH` deep, or more than
            :data:`MAX_EXPANDED_FIELDS` fields once common structs are counted at
            every use.
    """
    if not isinstance(doc, dict):
        raise SpecError("top level must be a JSON object", source)
    _check_keys(doc, _MESSAGE_KEYS, source, None)
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(f"invalid or missing message name {name!r}", source)
    mtype = doc.get("type")
    if mtype not in MESSAGE_TYPES:
        raise SpecError(f"invalid message type {mtype!r}", source)
    api_key = doc.get("apiKey")
    if mtype in ("request", "response"):
        if not isinstance(api_key, int) or isinstance(api_key, bool) or not 0 <= api_key <= 0x7FFF:
            raise SpecError(f"{mtype} needs an int16 apiKey, got {api_key!r}", source)
    valid = _versions(doc.get("validVersions"), source, None, "validVersions", required=True)
    flexible = _versions(doc.get("flexibleVersions"), source, None, "flexibleVersions",
                         required=True)
    deprecated = _versions(doc.get("deprecatedVersions"), source, None, "deprecatedVersions",
                           default=NONE)
    # Kafka's generator: MessageDataGenerator.generate ("does not specify a maximum
    # version") and the MessageSpec constructor
    if valid.highest == ALL.highest:
        raise SpecError(f"validVersions {valid} has no maximum version (use N-M)", source)
    if not flexible.empty and flexible.highest != ALL.highest:
        raise SpecError(f"flexibleVersions {flexible} must be none or open-ended (N+)", source)
    for key in ("listeners", "latestVersionUnstable"):
        if doc.get(key) and mtype != "request":
            raise SpecError(f"{key} is only valid for messages of type request", source)
    listeners = doc.get("listeners")
    if listeners is not None and (not isinstance(listeners, list) or
                                  not all(isinstance(x, str) for x in listeners)):
        raise SpecError(f"'listeners' must be a list of names, got {listeners!r}", source)
    unstable = doc.get("latestVersionUnstable", False)
    if unstable is not None and not isinstance(unstable, bool) and unstable not in ("true",
                                                                                   "false"):
        raise SpecError(f"latestVersionUnstable must be a boolean, got {unstable!r}", source)
    if not isinstance(doc.get("fields"), list):
        raise SpecError("missing 'fields' list", source)

    common = doc.get("commonStructs")
    if common is None:  # as Kafka's MessageSpec takes a null list
        common = []
    if not isinstance(common, list):
        raise SpecError(f"'commonStructs' must be a list, got {common!r}", source)
    ctx = _Context(source, valid, flexible)
    for cs in common:
        if not isinstance(cs, dict):
            raise SpecError("commonStructs entries must be objects", source)
        _check_keys(cs, _COMMON_KEYS, source, cs.get("name"))
        cname = cs.get("name")
        if not isinstance(cname, str) or not _NAME_RE.match(cname):
            raise SpecError(f"invalid common struct name {cname!r}", source)
        if not cname[0].isupper():  # Kafka's StructRegistry.register
            raise SpecError(f"common struct name {cname} must start with a capital letter",
                            source, cname)
        if cname in ctx.common_docs:
            raise SpecError(f"common struct {cname} defined twice", source, cname)
        ctx.common_docs[cname] = cs
    top = StructSpec(name, valid, [])
    top.fields = ctx.parse_fields(doc["fields"], name, valid, "")
    ctx.measure(top, "")
    for f in top.fields:  # Kafka's MessageDataGenerator.generateClass
        if f.map_key:
            raise SpecError("mapKey cannot be set on top-level fields", source, f.path)
    for cname in ctx.common_docs:
        if cname not in ctx.structs:  # unused common structs are still validated
            ctx.common_struct(cname, name)
    msg = MessageSpec(
        name=name, type=mtype, api_key=api_key if mtype in ("request", "response") else api_key,
        valid_versions=valid, flexible_versions=flexible, struct=top,
        common_structs={n: ctx.structs[n] for n in ctx.common_docs},
        source=source, listeners=list(listeners or []),
        latest_version_unstable=unstable in (True, "true"),
        deprecated_versions=deprecated,
    )
    for s in msg.structs():
        s.message = msg
    for s in msg.common_structs.values():
        s.message = msg
    return msg


class _Context:
    def __init__(self, source: str, valid: Versions, flexible: Versions):
        self.source = source
        self.valid = valid
        self.flexible = flexible
        self.common_docs: dict[str, dict] = {}
        self.structs: dict[str, StructSpec] = {}
        self._building: set[str] = set()
        self._depth = 0
        #: id(struct) -> (nesting depth, fields with its structs written out)
        self._sizes: dict[int, tuple[int, int]] = {}

    def err(self, reason: str, path: str) -> SpecError:
        return SpecError(reason, self.source, path or None)

    def measure(self, st: StructSpec, path: str) -> None:
        """Record the nesting depth and expanded field count of ``st``, whose struct
        fields are measured already (see :data:`MAX_STRUCT_DEPTH` and
        :data:`MAX_EXPANDED_FIELDS`).

        Raises:
            SpecError: either is over its limit.
        """
        depth, count = 1, len(st.fields)
        for f in st.fields:
            if f.struct is not None:
                d, n = self._sizes[id(f.struct)]
                depth, count = max(depth, d + 1), count + n
        if depth > MAX_STRUCT_DEPTH:
            raise self.err(f"structs nested {depth} deep (at most {MAX_STRUCT_DEPTH})", path)
        if count > MAX_EXPANDED_FIELDS:
            raise self.err(f"{count} fields with its structs written out where they are used "
                           f"(at most {MAX_EXPANDED_FIELDS})", path)
        self._sizes[id(st)] = (depth, count)

    def common_struct(self, cname: str, path: str) -> StructSpec:
        if cname in self._building:
            raise self.err(f"common struct {cname} refers to itself", path)
        if cname in self.structs:
            return self.structs[cname]
        cs = self.common_docs[cname]
        versions = _versions(cs.get("versions"), self.source, path, "versions", default=ALL)
        self._building.add(cname)
        st = StructSpec(cname, versions, [])
        self.structs[cname] = st
        st.fields = self.parse_fields(cs.get("fields") or [], cname, versions, cname)
        self.measure(st, cname)
        self._building.discard(cname)
        return st

    def parse_fields(self, docs: Any, owner: str, owner_versions: Versions,
                     path: str) -> list[FieldSpec]:
        if not isinstance(docs, list):
            raise self.err("'fields' must be a list", path)
        if self._depth >= MAX_STRUCT_DEPTH:  # before recursing further
            raise self.err(f"structs nested more than {MAX_STRUCT_DEPTH} deep", path)
        self._depth += 1
        try:
            fields = [self.parse_field(d, owner_versions, path) for d in docs]
        finally:
            self._depth -= 1
        names: set[str] = set()
        tags: dict[int, str] = {}
        for f in fields:
            if f.name in names:
                raise self.err(f"duplicate field name {f.name} in {owner}", f.path)
            names.add(f.name)
            if f.tag is not None:
                if f.tag in tags:
                    raise self.err(f"tag {f.tag} used by both {tags[f.tag]} and {f.name}",
                                   f.path)
                tags[f.tag] = f.name
        return fields

    def parse_field(self, d: Any, owner_versions: Versions, parent_path: str) -> FieldSpec:
        if not isinstance(d, dict):
            raise self.err("field entries must be objects", parent_path)
        name = d.get("name")
        path = f"{parent_path}.{name}" if parent_path else str(name)
        if not isinstance(name, str) or not _FIELD_NAME_RE.fullmatch(name):
            raise self.err(f"invalid field name {name!r} (letters and digits, a letter "
                           f"first)", path)
        _check_keys(d, _FIELD_KEYS, self.source, path)
        ftype = d.get("type")
        if not isinstance(ftype, str) or not ftype:
            raise self.err(f"missing or invalid type {ftype!r}", path)
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        if not _NAME_RE.match(elem):
            raise self.err(f"invalid type {ftype!r}", path)
        if elem not in PRIMITIVES and not elem[0].isupper():
            # Kafka's FieldType.parse: a struct type starts with a capital letter
            raise self.err(f"invalid type {ftype!r}: struct type names start with a capital "
                           f"letter", path)

        tag = d.get("tag")
        if isinstance(tag, str) and _TAG_TEXT_RE.fullmatch(tag.strip()):
            tag = int(tag)
        tagged_text = d.get("taggedVersions")
        if (tag is None) != (tagged_text is None):
            raise self.err("'tag' and 'taggedVersions' go together", path)
        tagged = _versions(tagged_text, self.source, path, "taggedVersions", default=NONE)
        if tag is not None:
            if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag <= 0x7FFFFFFF:
                raise self.err(f"invalid tag {tag!r}", path)
            if tagged.empty:
                raise self.err("a tagged field needs non-empty taggedVersions", path)
            if tagged.highest != ALL.highest:
                raise self.err(f"taggedVersions {tagged} must be open-ended (N+)", path)
        versions_text = d.get("versions")
        if versions_text is None and tag is not None:
            versions = tagged
        else:
            versions = _versions(versions_text, self.source, path, "versions", required=True)
        if tag is not None and not versions.is_superset_of(tagged):
            raise self.err(f"taggedVersions {tagged} not within versions {versions}", path)
        nullable = _versions(d.get("nullableVersions"), self.source, path, "nullableVersions",
                             default=NONE)
        if tag is not None:
            # Kafka's FieldSpec.checkTagInvariants and MessageDataGenerator
            both = nullable.intersect(tagged)
            if not (both.empty or both == tagged):
                raise self.err(f"nullableVersions {nullable} and taggedVersions {tagged}: "
                               f"either all tagged versions are nullable or none", path)
            if _bool(d, "mapKey", self, path):
                raise self.err("a tagged field cannot be a mapKey", path)
            if ftype == "records":
                raise self.err("a records field cannot be tagged", path)
        flex_override = None
        if "flexibleVersions" in d:
            flex_override = _versions(d["flexibleVersions"], self.source, path,
                                      "flexibleVersions")
            if ftype not in ("string", "bytes"):
                raise self.err("a field-level flexibleVersions is only allowed on string or "
                               "bytes fields", path)
            # Kafka's generator (MessageDataGenerator.fieldFlexibleVersions) refuses an
            # override that is not within the message's flexibleVersions
            if not self.flexible.is_superset_of(flex_override):
                raise self.err(f"flexibleVersions {flex_override} are not a subset of the "
                               f"message's flexibleVersions {self.flexible}", path)
        # Kafka's MessageDataGenerator.generateClassReader: a tagged field's versions
        # are within its flexible versions (its own flexibleVersions when it has them),
        # all of them, not only the valid ones; so a tagged string or bytes is compact
        field_flexible = self.flexible if flex_override is None else flex_override
        if not field_flexible.is_superset_of(tagged):
            raise self.err(f"taggedVersions {tagged} include non-flexible versions "
                           f"(flexibleVersions {field_flexible})", path)

        f = FieldSpec(
            name=name, type=ftype, versions=versions, nullable_versions=nullable,
            tagged_versions=tagged, tag=tag, flexible_versions=flex_override,
            ignorable=_bool(d, "ignorable", self, path), map_key=_bool(d, "mapKey", self, path),
            entity_type=d.get("entityType"), about=_about(d, self, path),
            zero_copy=_bool(d, "zeroCopy", self, path), path=path,
        )
        entity = f.entity_type
        if entity is not None:  # Kafka's EntityType.verifyTypeMatches
            if not isinstance(entity, str) or entity not in ENTITY_TYPES:
                raise self.err(f"unknown entityType {entity!r} (one of "
                               f"{', '.join(ENTITY_TYPES)})", path)
            if ENTITY_TYPES[entity] not in (None, elem):
                raise self.err(f"entityType {entity} needs type {ENTITY_TYPES[entity]} "
                               f"(or an array of it), not {ftype}", path)
        if f.zero_copy and elem not in ("bytes",):
            raise self.err("zeroCopy is only allowed on bytes fields", path)
        is_struct_type = elem not in PRIMITIVES
        if ftype.startswith("[]") and elem == "records":
            raise self.err("arrays of records are not allowed", path)
        if not nullable.empty:
            if not (ftype.startswith("[]") or is_struct_type or ftype in NULLABLE_TYPES):
                raise self.err(f"type {ftype} cannot be nullable", path)
        # struct types: inline definition, or a common struct
        if is_struct_type:
            sub_docs = d.get("fields")
            if sub_docs is not None:
                if elem in self.common_docs:
                    raise self.err(f"struct {elem} is also a common struct", path)
                if elem in self.structs:
                    raise self.err(f"struct type {elem} defined twice", path)
                st = StructSpec(elem, versions, [])
                self.structs[elem] = st
                st.fields = self.parse_fields(sub_docs, elem, versions, path)
                self.measure(st, path)
            elif elem in self.common_docs:
                st = self.common_struct(elem, path)
            else:
                raise self.err(f"unknown struct type {elem}", path)
            f.struct = st
        elif d.get("fields"):
            raise self.err(f"a field of type {ftype} cannot have sub-fields", path)

        f.default_text, f.default = _parse_default(d.get("default"), f, self, path)
        if "encoding" in d:
            f.encodings = _parse_encoding(d["encoding"], f, self, path)
        if not versions.empty and not owner_versions.is_superset_of(versions.intersect(self.valid)):
            # Kafka allows fields to list versions wider than their struct; only check
            # that the field exists in some version the owner has.
            if versions.intersect(owner_versions).empty:
                raise self.err(f"versions {versions} outside its struct's {owner_versions}", path)
        return f


def _check_keys(d: dict, allowed: set[str], source: str, path: str | None) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SpecError(f"unknown propert{'y' if len(unknown) == 1 else 'ies'} "
                        f"{', '.join(unknown)}", source, path)


def _about(d: dict, ctx: _Context, path: str) -> str:
    """A field's ``about`` text: a string (or null, as Kafka's FieldSpec takes it)."""
    v = d.get("about")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ctx.err(f"about must be a string, got {v!r}", path)
    return v


def _bool(d: dict, key: str, ctx: _Context, path: str) -> bool:
    v = d.get(key, False)
    if isinstance(v, str) and v in ("true", "false"):
        return v == "true"
    if not isinstance(v, bool):
        raise ctx.err(f"{key} must be a boolean, got {v!r}", path)
    return v


def _versions(text: Any, source: str, path: str | None, what: str, *,
              default: Versions | None = None, required: bool = False) -> Versions:
    if text is None:
        if required or default is None:
            raise SpecError(f"missing {what}", source, path)
        return default
    try:
        return Versions.parse(text)
    except ValueError as e:
        raise SpecError(f"{what}: {e}", source, path) from None


_JAVA_DEC = re.compile(r"[+-]?[0-9]+")
_JAVA_HEX = re.compile(r"[+-]?[0-9a-fA-F]+")
_JAVA_OCT = re.compile(r"0[0-7]+")


def parse_int_literal(text: str, ftype: str = "int64") -> int:
    """The value of an integer ``default`` as Kafka's generator makes it
    (``FieldSpec.fieldDefault``).

    The generator checks the text with ``Byte``/``Short``/``Integer``/``Long.valueOf(s,
    base)``, base 16 after a lower-case ``0x`` prefix (which it strips) and 10
    otherwise, then pastes the *text itself* into the generated Java source as a
    literal. So: ``""`` (or a bare ``"0x"``) is 0; ``"0x10"`` is 16; an optional
    ``+``/``-`` sign is allowed before decimal digits only (``"-0x10"``, ``"0X10"``,
    ``"#10"``, ``"1_000"``, ``" 1"`` fail ``valueOf``); the range check is the decimal
    (or hex) value's, against the field type; and a decimal text with a leading zero
    is a Java octal literal, so ``"010"`` is 8 (and ``"08"``, which passes the
    check but is no Java literal, does not compile).

    Raises:
        ValueError: a text Kafka's generator (or the Java compiler after it) rejects.
    """
    lo, hi = INT_RANGES[ftype]
    s, base = text, 10
    if s.startswith("0x"):
        s, base = s[2:], 16
    if s == "":
        return 0
    if not (_JAVA_HEX if base == 16 else _JAVA_DEC).fullmatch(s):
        raise ValueError("not a base-%d integer as Java's valueOf reads it" % base)
    checked = int(s, base)
    if not lo <= checked <= hi:
        raise ValueError(f"out of range for {ftype}")
    digits = s.lstrip("+-")
    if base == 16:
        if digits != s:  # "0x-10" passes valueOf but is no Java literal
            raise ValueError("a sign after 0x is not a Java literal")
        return checked
    if len(digits) > 1 and digits[0] == "0":
        if not _JAVA_OCT.fullmatch(digits):
            raise ValueError(f"{digits} is not a Java octal literal")
        return -int(digits, 8) if s[0] == "-" else int(digits, 8)
    return checked


# Double.parseDouble's grammar (FloatingDecimal.readJavaFormatString), after trim()
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)")
_JAVA_SPACE = "".join(chr(i) for i in range(33))  # what Java's String.trim() removes


def parse_double_literal(text: str) -> float:
    """A float64 ``default`` as Kafka's generated code reads it:
    ``Double.parseDouble(text)`` (``""`` is 0.0). Java's grammar, not Python's: no
    ``_`` separators, no ``inf``/``nan`` spellings but ``Infinity``/``NaN``; an
    optional ``f``/``d`` suffix and hex floats (``0x1.8p1``) are allowed.

    Raises:
        ValueError: a text ``Double.parseDouble`` rejects.
    """
    if text == "":
        return 0.0
    s = text.strip(_JAVA_SPACE)
    if not _JAVA_DOUBLE.fullmatch(s):
        raise ValueError("not a number as Java's Double.parseDouble reads it")
    if s[-1] in "fFdD" and not s.endswith("Infinity"):
        s = s[:-1]
    body = s.lstrip("+-")
    if body[:2] in ("0x", "0X"):
        v = float.fromhex(body)
        return -v if s[0] == "-" else v
    return float(s.replace("Infinity", "inf").replace("NaN", "nan"))


def uuid_from_text(text: str) -> bytes:
    """Kafka's textual uuid (URL-safe base64 of 16 bytes, no padding) → 16 bytes."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"uuid {text!r} does not hold 16 bytes")
    return raw


def uuid_to_text(raw: bytes) -> str:
    """16 bytes → Kafka's textual uuid (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(bytes(raw)).decode("ascii").rstrip("=")


def _parse_default(raw: Any, f: FieldSpec, ctx: _Context, path: str) -> tuple[str | None, Any]:
    """``(text, value)`` of a field's ``default`` as Kafka's generator reads it
    (``FieldSpec.fieldDefault``): the JSON value as the string Jackson makes of it
    (numbers and booleans are coerced), an absent default the same as ``""``."""
    t = f.type
    if isinstance(raw, (list, dict)):
        raise ctx.err(f"invalid default {raw!r}: a default is a string", path)
    text = None if raw is None else (raw if isinstance(raw, str) else
                                     ("true" if raw is True else "false" if raw is False
                                      else str(raw)))
    if t == "records" and not f.is_array:
        # the generator's records default is null, whatever the spec says (unchecked)
        return text, None
    if text == "null":
        # Kafka's FieldSpec.validateNullDefault: nullable in all the field's versions
        # (as written, not only the message's valid ones)
        if not f.nullable_versions.is_superset_of(f.versions):
            raise ctx.err("a null default needs the field nullable in all its versions", path)
        return text, None
    if f.is_array or f.struct is not None:
        if text not in (None, ""):
            raise ctx.err(f"invalid default {raw!r} for {t}: only null is allowed", path)
        return None, None
    s = "" if text is None else text
    try:
        if t in INT_RANGES:
            return text, parse_int_literal(s, t)
        if t == "bool":
            # "" is false; "true"/"false" in any case (equalsIgnoreCase)
            if s.lower() not in ("", "true", "false"):
                raise ValueError("not true or false")
            return text, s.lower() == "true"
        if t == "float64":
            return text, parse_double_literal(s)
        if t == "string":
            return text, s
        if t == "uuid":
            return text, _ZERO_UUID if s == "" else uuid_from_text(s)
        if t == "bytes":
            if s != "":
                raise ValueError("bytes fields take no default but null or empty")
            return None, b""
    except ValueError as e:
        raise ctx.err(f"invalid default {raw!r}: {e}", path) from None
    raise ctx.err(f"unsupported type {t}", path)


def _parse_encoding(raw: Any, f: FieldSpec, ctx: _Context, path: str) -> list[tuple[Versions, str]]:
    width = ENCODABLE_WIDTH.get(f.type)
    if width is None:
        raise ctx.err(f"'encoding' is only allowed on int16/int32/int64 fields, not {f.type}",
                      path)

    def kind_of(name: Any) -> str:
        if not isinstance(name, str):
            raise ctx.err(f"encoding must be a string, got {name!r}", path)
        m = re.fullmatch(r"(fixed|packed|upacked)(16|32|64)", name)
        if not m:
            raise ctx.err(f"unknown encoding {name!r} (expected fixedN, packedN or upackedN)",
                          path)
        if int(m.group(2)) != width:
            raise ctx.err(f"encoding {name} does not match the field type {f.type}", path)
        return m.group(1)

    if isinstance(raw, str):
        return [(f.versions, kind_of(raw))]
    if not isinstance(raw, dict) or not raw:
        raise ctx.err("encoding must be a string or a non-empty map of version ranges", path)
    out: list[tuple[Versions, str]] = []
    for rng_text, name in raw.items():
        rng = _versions(rng_text, ctx.source, path, "encoding version range")
        if rng.empty:
            raise ctx.err(f"empty encoding version range {rng_text!r}", path)
        for prev, _ in out:
            if not prev.intersect(rng).empty:
                raise ctx.err(f"encoding version ranges {prev} and {rng} overlap", path)
        out.append((rng, kind_of(name)))
    out.sort()
    need = f.versions.intersect(ctx.valid)
    v = need.lowest
    for rng, _ in out:
        if v > need.highest:
            break
        if rng.lowest > v:
            break
        v = max(v, rng.highest + 1)
    if not need.empty and v <= need.highest:
        raise ctx.err(f"encoding ranges do not cover version {v} of the field "
                      f"(versions {need})", path)
    return out
