"""What-if encoders: the size of a decoded message under proposed wire encodings.

Sans-io, like the rest of :mod:`kinspect.codec`: values and specs in, bytes out.
Used by the capture analysis (``kinspect analyze``) to answer "how many bytes would
this traffic take if the protocol had done X", for two families of proposals:

1. **Variable-length integers** (KIP-625, "Richer encodings for integral-typed
   protocol fields"): int16/int32/int64 fields written as ``packed`` (zig-zag
   varint) or ``upacked`` (unsigned varint) instead of ``fixed`` big-endian.
   These sizes come from the codec itself: :func:`compile_with_encodings` copies a
   message spec, sets :attr:`FieldSpec.encodings` on the chosen fields and compiles
   the copy with :class:`~kinspect.codec.registry.MessageCodec`; the copy shares the
   original's value classes, so decoded values encode with it directly.

   The spec format allows ``encoding`` only on scalar int fields. The walker below
   (:func:`encode_message`) also applies it to the *elements* of ``[]int16`` /
   ``[]int32`` / ``[]int64`` arrays (``elements=True``), which KIP-625's own
   MetadataResponse example needs (replica lists are int32 arrays).

   Rules (per field, keyed by :func:`field_key`):

   * ``packed``: every int field zig-zag; always representable.
   * ``upacked``: every int field unsigned; a message holding a negative value in
     any int field cannot be written (size ``None``).
   * ``best``: per field, over all values seen in the data analysed: ``upacked``
     when the field never held a negative value, else ``packed``. For ``v >= 0``
     an unsigned varint is never longer than the zig-zag one (zig-zag doubles the
     magnitude), so this is the smaller of the two for every field; it is a schema
     decision, fixed for the data set, as a spec's ``encoding`` property would be.

2. **Early drafts of tagged fields** (KIP-482 discussion), in flexible versions
   only, with every other byte as in the final KIP-482 format (compact lengths,
   tagged values encoded as in a final tag section):

   * ``"kip482"`` - the final format: at the *end* of each struct an unsigned
     varint count, then per field ``uvarint tag, uvarint size, data``, tags
     ascending. The walker reproduces the codec's bytes exactly in this layout.
   * ``"draft-a"`` - the tag section at the *start* of each struct; each field is
     one unsigned varlong *tag header* whose even bits (0, 2, 4, ...) hold the
     data length and odd bits (1, 3, 5, ...) the tag (:func:`interleave`), then
     the data; a header of 0 ends the section. (Tag 0 with 0 bytes cannot occur:
     every value takes at least one byte. A leading count instead of the
     terminator gives the same size for fewer than 128 tags.)
   * ``"draft-b"`` - the "optional fields" draft: a buffer at the start of each
     struct of entries ``uvarint length, int16 tag, value`` where the length
     counts the 2 tag bytes plus the value, ending with a zero length. Tags above
     32767 cannot be written (:class:`EncodeError`).

Errors: :class:`~kinspect.codec.errors.EncodeError` for a value that cannot be
written under the requested encoding (a negative value as ``upacked``, a tag
beyond int16 in draft b) or is not valid for its field.
"""

from __future__ import annotations

import copy
import struct as _struct
from collections.abc import Iterable, Mapping
from typing import Any

from .compiler import FIXED, tag_data, write_uvarint
from .errors import EncodeError
from .spec import FieldSpec, MessageSpec, StructSpec
from .values import Struct, struct_class, tag_written

__all__ = [
    "INT_TYPES",
    "LAYOUTS",
    "TagStats",
    "VarintSizer",
    "best_kinds",
    "compile_with_encodings",
    "encode_message",
    "field_key",
    "int_fields",
    "interleave",
    "negative_fields",
    "scan_message",
    "varint_size",
    "zigzag",
]

INT_TYPES = {"int16": 16, "int32": 32, "int64": 64}
LAYOUTS = ("kip482", "draft-a", "draft-b")
_PACK = {t: _struct.Struct(">" + code).pack for t, (code, _) in FIXED.items() if t != "uuid"}
_H = _struct.Struct(">h").pack
_I = _struct.Struct(">i").pack


def field_key(spec: MessageSpec, f: FieldSpec) -> str:
    """``"MetadataResponse:Topics.Partitions.LeaderId"``: names one field of one
    message (a common struct's field once, wherever the struct is used)."""
    return f"{spec.name}:{f.path}"


def int_fields(spec: MessageSpec, *, elements: bool = False) -> list[FieldSpec]:
    """The int16/int32/int64 fields of every struct of ``spec`` (with
    ``elements=True`` also ``[]int16/[]int32/[]int64`` arrays), each once."""
    out = []
    seen: set[int] = set()
    for st in list(spec.structs()) + list(spec.common_structs.values()):
        for f in st.fields:
            if id(f) in seen:
                continue
            seen.add(id(f))
            if f.type in INT_TYPES or (elements and f.is_array and f.element_type in INT_TYPES):
                out.append(f)
    return out


def zigzag(n: int, bits: int) -> int:
    """Zig-zag map of a signed ``bits``-wide integer to an unsigned one."""
    return ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)


def varint_size(n: int) -> int:
    """Bytes of ``n >= 0`` as an unsigned varint."""
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def interleave(length: int, tag: int) -> int:
    """Draft-a tag header: bit ``i`` of ``length`` at bit ``2i``, bit ``i`` of
    ``tag`` at bit ``2i + 1``.

    Raises:
        EncodeError: a negative length or tag, or a header wider than 64 bits.
    """
    if length < 0 or tag < 0:
        raise EncodeError(f"negative length {length} or tag {tag} in a tag header")
    h = 0
    i = 0
    while length or tag:
        h |= (length & 1) << (2 * i) | (tag & 1) << (2 * i + 1)
        length >>= 1
        tag >>= 1
        i += 1
    if h >> 64:
        raise EncodeError("draft-a tag header wider than 64 bits")
    return h


# ---------------------------------------------------------------------------
# walking values


def _present(f: FieldSpec, version: int) -> bool:
    return f.versions.contains(version)


def negative_fields(spec: MessageSpec, value: Struct, version: int) -> set[str]:
    """Keys (:func:`field_key`) of the int fields, and int arrays, holding a negative
    value somewhere in ``value`` (a decoded message at ``version``)."""
    out: set[str] = set()
    _neg(spec, spec.struct, value, version, out)
    return out


def _neg(spec: MessageSpec, st: StructSpec, value: Struct, version: int, out: set[str]) -> None:
    for f in st.fields:
        if not _present(f, version):
            continue
        v = getattr(value, f.name)
        if v is None:
            continue
        if f.struct is not None:
            if f.is_array:
                for x in v:
                    _neg(spec, f.struct, x, version, out)
            else:
                _neg(spec, f.struct, v, version, out)
        elif (f.type in INT_TYPES and v < 0) or \
                (f.is_array and f.element_type in INT_TYPES and v and min(v) < 0):
            out.add(field_key(spec, f))


class _Plan:
    """What :func:`scan_message` looks at in one struct at one version."""

    __slots__ = ("children", "int_arrays", "ints", "tagged")

    def __init__(self, spec: MessageSpec, st: StructSpec, version: int, flexible: bool):
        self.ints: list[tuple[str, str]] = []
        self.int_arrays: list[tuple[str, str]] = []
        self.children: list[tuple[str, StructSpec, bool]] = []
        self.tagged: list[FieldSpec] = []
        for f in st.fields:
            if not f.versions.contains(version):
                continue
            if flexible and f.tagged_in(version):
                self.tagged.append(f)
            if f.struct is not None:
                self.children.append((f.name, f.struct, f.is_array))
            elif f.type in INT_TYPES:
                self.ints.append((f.name, field_key(spec, f)))
            elif f.is_array and f.element_type in INT_TYPES:
                self.int_arrays.append((f.name, field_key(spec, f)))


#: (struct, message, version) -> plan; keyed by the spec objects themselves (their
#: hash is identity), which keeps them alive so an id is never reused
_PLANS: dict[tuple[StructSpec, MessageSpec, int], _Plan] = {}


def scan_message(spec: MessageSpec, value: Struct, version: int, *,
                 negative: set[str] | None = None, stats: TagStats | None = None) -> None:
    """One pass over a decoded message collecting what the analysis needs without
    re-encoding it: the keys of int fields holding a negative value (added to
    ``negative``, as :func:`negative_fields`) and, in flexible versions, every tag
    section as the final KIP-482 layout writes it (given to ``stats``, as
    :func:`encode_message` with ``stats`` does; only tagged values are encoded)."""
    flexible = spec.is_flexible(version)
    walker = _Walker(spec, version, "kip482", {}, False, None) if stats is not None else None
    _scan(spec, spec.struct, value, version, flexible, negative, stats, walker, spec.name)


def _scan(spec: MessageSpec, st: StructSpec, o: Struct, version: int, flexible: bool,
          negative: set[str] | None, stats: TagStats | None, walker: _Walker | None,
          path: str) -> None:
    key = (st, spec, version)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _Plan(spec, st, version, flexible)
    if negative is not None:
        for name, k in plan.ints:
            v = getattr(o, name)
            if v is not None and v < 0:
                negative.add(k)
        for name, k in plan.int_arrays:
            v = getattr(o, name)
            if v and min(v) < 0:
                negative.add(k)
    if stats is not None and flexible:
        entries: list[tuple[int, str | None, int]] = []
        present = getattr(o, "_present", None)
        for f in plan.tagged:
            val = getattr(o, f.name)
            if tag_written(f, val, present):
                data = bytearray()
                walker.field(f, val, data, True, path)
                entries.append((f.tag, f.name, len(data)))
        unknown = o._unknown
        if unknown:
            entries.extend((t, None, len(tag_data(t, b))) for t, b in unknown.items())
            entries.sort(key=lambda e: e[0])
        stats.add(path, entries)
    for name, sub, is_array in plan.children:
        v = getattr(o, name)
        if v is None:
            continue
        p = f"{path}.{name}"
        if is_array:
            for x in v:
                _scan(spec, sub, x, version, flexible, negative, stats, walker, p)
        else:
            _scan(spec, sub, v, version, flexible, negative, stats, walker, p)


# ---------------------------------------------------------------------------
# 1. varints through the codec


def compile_with_encodings(spec: MessageSpec, kinds: Mapping[str, str]) -> Any:
    """A :class:`~kinspect.codec.registry.MessageCodec` for a copy of ``spec`` whose
    int16/int32/int64 fields named in ``kinds`` (:func:`field_key` → ``"fixed"``,
    ``"packed"`` or ``"upacked"``) carry that ``encoding`` in all their versions.

    The copy keeps the original's value classes (same field names), so values
    decoded with the original encode with the copy. Keys of array fields are
    ignored (the spec format allows ``encoding`` on scalar fields only).
    """
    from .registry import MessageCodec  # registry imports this package's compiler

    struct_class(spec.struct)
    for st in spec.common_structs.values():
        struct_class(st)
    twin = copy.deepcopy(spec)  # classes are copied by reference: cls stays shared
    for f in int_fields(twin):
        kind = kinds.get(field_key(twin, f))
        f.encodings = None if kind in (None, "fixed") else [(f.versions, kind)]
    return MessageCodec(twin)


class VarintSizer:
    """Sizes of decoded messages with every int field ``packed``, ``upacked``, or the
    per-field ``best`` (see the module docstring), computed by codecs compiled from
    modified spec copies (cached per message and choice).

    Args:
        negative: keys of the fields seen negative in the whole data set (decides
            ``best``); fields not listed are written ``upacked``.
    """

    def __init__(self, negative: Iterable[str] = ()):
        self.negative = frozenset(negative)
        # keyed by the spec objects (identity): two registries may both define a
        # message of one name differently
        self._codecs: dict[tuple[MessageSpec, str], Any] = {}
        self._kinds: dict[tuple[MessageSpec, bool], dict[str, str]] = {}

    def kinds(self, spec: MessageSpec, *, elements: bool = False) -> dict[str, str]:
        """The ``best`` choice for ``spec``'s fields (:func:`best_kinds`), cached."""
        key = (spec, elements)
        k = self._kinds.get(key)
        if k is None:
            k = self._kinds[key] = best_kinds(spec, self.negative, elements=elements)
        return k

    def codec(self, spec: MessageSpec, variant: str) -> Any:
        key = (spec, variant)
        c = self._codecs.get(key)
        if c is None:
            fields = int_fields(spec)
            if variant == "best":
                kinds = self.kinds(spec)
            else:
                kinds = {field_key(spec, f): variant for f in fields}
            c = self._codecs[key] = compile_with_encodings(spec, kinds)
        return c

    def size(self, spec: MessageSpec, value: Struct, version: int, variant: str) -> int | None:
        """Bytes of ``value`` under ``variant`` (``"packed"``, ``"upacked"``,
        ``"best"``); ``None`` when it cannot be written (a negative value as
        ``upacked``)."""
        try:
            return len(self.codec(spec, variant).encode(value, version))
        except EncodeError:
            if variant == "packed":
                raise
            return None


# ---------------------------------------------------------------------------
# 2. the spec-walking encoder (tag layouts; ints on array elements)


class TagStats:
    """Collects, per struct path, what the tag sections of encoded messages held.

    ``sections[path] = [count, bytes, data_bytes]`` (tag sections written, their
    bytes in the final KIP-482 layout, and the bytes of the tagged values in them); ``tags[(path, tag)] = [name or None, count,
    data_bytes, bytes]`` where ``bytes`` includes the tag and size varints and
    ``name`` is ``None`` for a tag no spec field defines (an unknown tag).
    """

    __slots__ = ("sections", "tags")

    def __init__(self) -> None:
        self.sections: dict[str, list[int]] = {}
        self.tags: dict[tuple[str, int], list] = {}

    def add(self, path: str, entries: list[tuple[int, str | None, int]]) -> None:
        total = varint_size(len(entries))
        data = 0
        for tag, name, size in entries:
            entry = varint_size(tag) + varint_size(size) + size
            total += entry
            data += size
            t = self.tags.get((path, tag))
            if t is None:
                self.tags[(path, tag)] = [name, 1, size, entry]
            else:
                t[1] += 1
                t[2] += size
                t[3] += entry
        s = self.sections.get(path)
        if s is None:
            self.sections[path] = [1, total, data]
        else:
            s[0] += 1
            s[1] += total
            s[2] += data


class _Walker:
    __slots__ = ("elements", "flexible", "ints", "layout", "spec", "stats", "version")

    def __init__(self, spec: MessageSpec, version: int, layout: str, ints: Mapping[str, str],
                 elements: bool, stats: TagStats | None):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown tag layout {layout!r} (expected one of {LAYOUTS})")
        self.spec = spec
        self.version = version
        self.flexible = spec.is_flexible(version)
        self.layout = layout
        self.ints = ints
        self.elements = elements
        self.stats = stats

    def struct(self, st: StructSpec, o: Struct, out: bytearray, path: str) -> None:
        v = self.version
        if not self.flexible:
            for f in st.fields:
                if _present(f, v):
                    self.field(f, getattr(o, f.name), out, False, path)
            return
        tagged: list[tuple[int, str | None, bytes]] = []
        body = bytearray()
        present = getattr(o, "_present", None)
        for f in st.fields:
            if not _present(f, v):
                continue
            val = getattr(o, f.name)
            if f.tagged_in(v):
                if tag_written(f, val, present):
                    data = bytearray()
                    self.field(f, val, data, True, path)
                    tagged.append((f.tag, f.name, bytes(data)))
            else:
                self.field(f, val, body, False, path)
        unknown = o._unknown
        if unknown:
            tagged.extend((t, None, bytes(tag_data(t, b))) for t, b in unknown.items())
            tagged.sort(key=lambda e: e[0])
        last = -1
        for tag, _, _ in tagged:
            if tag <= last:
                raise EncodeError(f"duplicate tag {tag}", path)
            last = tag
        if self.stats is not None:
            self.stats.add(path, [(t, n, len(d)) for t, n, d in tagged])
        layout = self.layout
        if layout == "kip482":
            out += body
            write_uvarint(out, len(tagged))
            for tag, _, data in tagged:
                write_uvarint(out, tag)
                write_uvarint(out, len(data))
                out += data
        elif layout == "draft-a":
            for tag, _, data in tagged:
                write_uvarint(out, interleave(len(data), tag))
                out += data
            out.append(0)
            out += body
        else:
            for tag, _, data in tagged:
                if tag > 0x7FFF:
                    raise EncodeError(f"tag {tag} does not fit the int16 tag of draft b", path)
                write_uvarint(out, 2 + len(data))
                out += _H(tag)
                out += data
            out.append(0)
            out += body

    def _int(self, f: FieldSpec, t: str, x: Any, out: bytearray, kind: str) -> None:
        if isinstance(x, bool) or not isinstance(x, int):
            raise EncodeError(f"{x!r} is not a valid {t}", f.name)
        if kind == "fixed":
            try:
                out += _PACK[t](x)
            except _struct.error:
                raise EncodeError(f"{x!r} is not a valid {t}", f.name) from None
        elif kind == "packed":
            write_uvarint(out, zigzag(x, INT_TYPES[t]))
        elif kind == "upacked":
            if x < 0:
                raise EncodeError(f"negative value {x} cannot be written as an unsigned varint",
                                  f.name)
            write_uvarint(out, x)
        else:
            raise EncodeError(f"unknown encoding {kind!r}", f.name)

    def prim(self, f: FieldSpec, t: str, x: Any, out: bytearray, compact: bool,
             nullable: bool, kind: str) -> None:
        if t in INT_TYPES:
            self._int(f, t, x, out, kind)
            return
        if t == "uuid":
            if not isinstance(x, (bytes, bytearray)) or len(x) != 16:
                raise EncodeError("uuid must be 16 bytes", f.name)
            out += x
            return
        if t in _PACK:
            try:
                out += _PACK[t](x)
            except _struct.error:
                raise EncodeError(f"{x!r} is not a valid {t}", f.name) from None
            return
        if x is None:
            if not nullable:
                raise EncodeError(f"null for non-nullable {t} field {f.name}", f.name)
            if compact:
                out.append(0)
            else:
                out += b"\xff\xff" if t == "string" else b"\xff\xff\xff\xff"
            return
        b = x.encode("utf-8", "surrogateescape") if t == "string" else x
        if compact:
            write_uvarint(out, len(b) + 1)
        elif t == "string":
            out += _H(len(b))
        else:
            out += _I(len(b))
        out += b

    def field(self, f: FieldSpec, val: Any, out: bytearray, in_tag: bool, path: str) -> None:
        v = self.version
        if in_tag:
            compact = True
        elif f.flexible_versions is not None:
            compact = f.flexible_versions.contains(v)
        else:
            compact = self.flexible
        nullable = f.nullable_in(v)
        if f.is_array:
            if val is None:
                if not nullable:
                    raise EncodeError(f"null for non-nullable array {f.name}", f.name)
                if compact:
                    out.append(0)
                else:
                    out += b"\xff\xff\xff\xff"
                return
            if compact:
                write_uvarint(out, len(val) + 1)
            else:
                out += _I(len(val))
            if f.struct is not None:
                sub = f"{path}.{f.name}"
                for x in val:
                    self.struct(f.struct, x, out, sub)
                return
            et = f.element_type
            kind = "fixed"
            if self.elements and et in INT_TYPES:
                kind = self.ints.get(field_key(self.spec, f), "fixed")
            for x in val:
                self.prim(f, et, x, out, compact, False, kind)
            return
        if f.struct is not None:
            if nullable:
                if val is None:
                    out.append(0 if in_tag else 255)
                    return
                out.append(1)
            self.struct(f.struct, val, out, f"{path}.{f.name}")
            return
        kind = self.ints.get(field_key(self.spec, f), "fixed") if f.type in INT_TYPES else "fixed"
        self.prim(f, f.type, val, out, compact, nullable, kind)


def encode_message(spec: MessageSpec, value: Struct, version: int, *, layout: str = "kip482",
                   ints: Mapping[str, str] | None = None, elements: bool = False,
                   stats: TagStats | None = None) -> bytes:
    """Encode a decoded message (or header) by walking its spec.

    Args:
        spec: the message's spec; ``value`` a value of its class at ``version``.
        layout: where and how tag sections are written, one of :data:`LAYOUTS`
            (see the module docstring). ``"kip482"`` with no ``ints`` gives the
            same bytes as the codec.
        ints: :func:`field_key` → ``"fixed"``, ``"packed"`` or ``"upacked"`` for int
            fields (missing keys: ``"fixed"``).
        elements: also apply ``ints`` to the elements of int arrays.
        stats: a :class:`TagStats` that receives every tag section written (as it
            would be in the KIP-482 layout), per struct path
            (``"MetadataResponse.Topics.Partitions"``).

    Returns:
        The encoded bytes.

    Raises:
        EncodeError: see the module docstring; ``ValueError`` for an unknown layout.
    """
    w = _Walker(spec, version, layout, ints or {}, elements, stats)
    out = bytearray()
    w.struct(spec.struct, value, out, spec.name)
    return bytes(out)


def best_kinds(spec: MessageSpec, negative: Iterable[str] | frozenset, *,
               elements: bool = False) -> dict[str, str]:
    """The per-field ``best`` choice: ``packed`` for keys in ``negative``, else
    ``upacked``, for every int field (and int array with ``elements``) of ``spec``."""
    neg = negative if isinstance(negative, (set, frozenset)) else set(negative)
    out = {}
    for f in int_fields(spec, elements=elements):
        k = field_key(spec, f)
        out[k] = "packed" if k in neg else "upacked"
    return out

