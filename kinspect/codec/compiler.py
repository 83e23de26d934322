"""Per-(struct, version) Python code generated from message specs.

For each message version two variants are generated and compiled once with
``exec``:

* the *fast* variant, one function per message version with nested structs
  generated inline (array elements are decoded and encoded in the parent's loop,
  no call per element). Fixed-width runs are read with one precompiled
  :class:`struct.Struct` that also takes the next field's length prefix (int16,
  int32, or speculatively the first byte of a compact uvarint); arrays of
  fixed-width primitives use precompiled struct functions (a table per type for
  counts below 128, else one repeat count), arrays of fixed-width structs iterate
  one precompiled struct of one element over the bytes when every tag section is
  empty. Nothing kept between calls grows with the input (no struct format is
  built or cached per element count). One- and two-byte varints are read inline.
  Bounds are checked only where a short slice or an allocation could otherwise
  pass silently: lengths and counts are checked against the bytes left *before*
  anything is allocated (KAFKA-14063);
* the *traced* variant: one function per struct, every field checked and pushed
  on a trace stack. It runs only after the fast variant failed, to turn whatever
  went wrong into a :class:`~kinspect.codec.errors.DecodeError` (or
  ``EncodeError``) carrying the field path, byte offset and what was expected.

Wire formats follow the Kafka protocol guide and KIP-482 (tagged fields, compact
types, unsigned varints), KIP-893 (nullable structs) and the proposed per-field
``encoding`` property (fixedN / packedN zig-zag varint / upackedN unsigned varint).
Booleans decode as ``byte != 0`` (as Kafka reads them) and are written as 0/1.
Strings are decoded from UTF-8 with the ``surrogateescape`` error handler and encoded
with it: Kafka reads them with ``new String(bytes, UTF_8)`` (``Readable.readString``),
which replaces invalid UTF-8 with U+FFFD rather than failing, so brokers accept such
frames; kinspect decodes them too, and keeps each invalid byte as a lone surrogate
(U+DC80..U+DCFF) so that the value encodes back to exactly the bytes it came from.
Nulls are read as Kafka's generated readers read them: any negative length of a
nullable string, bytes, records or array; a nullable struct's int8 marker when
negative (present otherwise, not only for 1), a tagged one's unsigned varint marker
when 0 or 2^31 and above (a Java int <= 0). They are written as -1 (int8 marker -1,
compact length 0, tagged marker 0). A negative length in a non-nullable field is a
DecodeError.
"""

from __future__ import annotations

import struct as _struct
import threading
from typing import Any

from .codecache import compile_cached
from .errors import DecodeError, EncodeError
from .native import native_module
from .spec import INT_RANGES, FieldSpec, MessageSpec, StructSpec
from .values import Struct, attribute_alias, nan_default, struct_class

#: the C fast path's module (kinspect.codec._native), or None when it is not used
_native = native_module()

# (struct format char, size) of fixed-width primitives
FIXED = {
    "bool": ("?", 1), "int8": ("b", 1), "int16": ("h", 2), "uint16": ("H", 2),
    "int32": ("i", 4), "uint32": ("I", 4), "int64": ("q", 8), "float64": ("d", 8),
    "uuid": ("16s", 16),
}
_WIDTH_BITS = {"int16": 16, "int32": 32, "int64": 64}


def _attr(f: FieldSpec) -> str:
    """The attribute generated code reads and writes for field ``f``
    (:func:`~kinspect.codec.values.attribute_alias`: a keyword gets its alias)."""
    return attribute_alias(f.name)


def _ecode(t: str) -> str:
    """The struct code used to *write* a fixed-width type: booleans are written with
    ``B`` so that a non-bool value fails (``?`` would accept any object)."""
    return "B" if t == "bool" else FIXED[t][0]

# ---------------------------------------------------------------------------
# runtime helpers used by generated code


def _derr(reason: str, expected: str | None = None, offset: int | None = None) -> DecodeError:
    return DecodeError(reason, offset=offset, expected=expected)


def read_uvarint(buf: bytes, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """Read an unsigned varint (KIP-482) at ``pos``; return ``(value, new_pos)``.

    Raises:
        DecodeError: truncated, or longer than ``max_bytes`` (5 for 32-bit, 10 for
            64-bit values).
    """
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        v = b & 0x7F
        b = buf[pos + 1]
        if b < 0x80:
            return v | (b << 7), pos + 2
        v |= (b & 0x7F) << 7
        b = buf[pos + 2]
        if b < 0x80:
            return v | (b << 14), pos + 3
    except IndexError:
        raise DecodeError("truncated varint", offset=pos, expected="varint") from None
    return _read_uvarint_long(buf, pos, max_bytes)


def _read_uvarint_long(buf: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    value = 0
    shift = 0
    end = len(buf)
    start = pos
    while True:
        if pos >= end:
            raise DecodeError("truncated varint", offset=start, expected="varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if pos - start >= max_bytes:
            raise DecodeError(f"varint longer than {max_bytes} bytes", offset=start,
                              expected="varint")
    if max_bytes == 5 and value > 0xFFFFFFFF:
        raise DecodeError("varint exceeds 32 bits", offset=start, expected="varint")
    return value, pos


def read_compact_prefix(buf: bytes, pos: int) -> tuple[int, int]:
    """Read the unsigned varint of a compact length (KIP-482) at ``pos`` as Kafka's
    generated readers use it: ``length = readUnsignedVarint() - 1`` in Java ``int``
    arithmetic, where ``readUnsignedVarint`` returns an ``int``. A varint of 2^31 and
    above is negative there, so ``length`` is negative (a null in a nullable field,
    an error otherwise), except 2^31 itself: ``Integer.MIN_VALUE - 1`` wraps to
    ``Integer.MAX_VALUE``, a length no frame holds. Returns ``(length + 1, new_pos)``
    so that callers subtract one as for any other prefix."""
    v, pos = read_uvarint(buf, pos)
    if v > 0x7FFFFFFF:
        n = v - 1
        if n > 0x7FFFFFFF:
            n -= 0x100000000
        return n + 1, pos
    return v, pos


def _uvl(buf: bytes, pos: int) -> tuple[int, int]:
    return read_uvarint(buf, pos, 10)


def _zz32(buf: bytes, pos: int) -> tuple[int, int]:
    v, pos = read_uvarint(buf, pos, 5)
    return (v >> 1) ^ -(v & 1), pos


def _zz64(buf: bytes, pos: int) -> tuple[int, int]:
    v, pos = read_uvarint(buf, pos, 10)
    return (v >> 1) ^ -(v & 1), pos


def write_uvarint(out: bytearray, n: int) -> None:
    """Append ``n`` (>= 0) as an unsigned varint."""
    if n < 0:
        raise EncodeError(f"negative value {n} for an unsigned varint")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _wzz(out: bytearray, n: int, bits: int) -> None:
    """Append ``n`` as a zig-zag varint of a ``bits``-wide signed field (packedN)."""
    lim = 1 << (bits - 1)
    if isinstance(n, bool) or not isinstance(n, int) or not -lim <= n < lim:
        raise EncodeError(f"{n!r} is not a valid int{bits}")
    write_uvarint(out, ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1))


def _wup(out: bytearray, n: int, bits: int) -> None:
    """Append ``n`` as an unsigned varint of a ``bits``-wide field (upackedN)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < (1 << (bits - 1)):
        if isinstance(n, int) and n < 0:
            raise EncodeError(f"negative value {n} cannot be written as an unsigned varint")
        raise EncodeError(f"{n!r} is not a valid non-negative int{bits}")
    write_uvarint(out, n)


def _check_int(v: Any, t: str) -> None:
    lo, hi = INT_RANGES[t]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise EncodeError(f"{v!r} is not a valid {t}")


def check_value(v: Any, t: str) -> None:
    """The rule every encoder applies to a value of the fixed-width type ``t``: ints
    (not bools) in range for integer types, ``True``/``False`` for bool, an int or
    float (not a bool) for float64, 16 bytes for uuid.

    Raises:
        EncodeError: the value does not fit.
    """
    if t in INT_RANGES:
        _check_int(v, t)
    elif t == "bool":
        if not isinstance(v, bool):
            raise EncodeError(f"expected a boolean, got {v!r}")
    elif t == "float64":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise EncodeError(f"expected a float64, got {v!r}")
    elif t == "uuid":
        # a memoryview is measured in bytes (nbytes), not items: one of four int32
        # items holds 16 bytes
        if not isinstance(v, (bytes, bytearray, memoryview)) or \
                (v.nbytes if isinstance(v, memoryview) else len(v)) != 16:
            raise EncodeError(f"uuid must be 16 bytes, got {v!r}")


class _Declined(Exception):
    """Raised by a fast encoder for a value it does not take as it is (a type it
    does not check exactly, e.g. an int subclass or a tuple for an array): the
    traced encoder then encodes the value or raises the precise EncodeError."""


#: the exact types the fast encoders take without asking the traced encoder
_FAST_TYPE = {"bool": "_bool", "int8": "_int", "int16": "_int", "uint16": "_int",
              "int32": "_int", "uint32": "_int", "int64": "_int", "float64": "_float"}
#: the same as Python types, by spec type
_FAST_PY = {t: {"_bool": bool, "_int": int, "_float": float}[n] for t, n in _FAST_TYPE.items()}


def _ua(code: str, n: int, buf: bytes, pos: int) -> list:
    """``n`` fixed-width ``code`` values at ``pos``. The format ``">{n}{code}"`` is
    one repeat count, not ``n`` codes, and is not kept here (the struct module's own
    small cache may hold it)."""
    return list(_struct.unpack_from(">%d%s" % (n, code), buf, pos))


def _pa(code: str, v: list) -> bytes:
    return _struct.pack(">%d%s" % (len(v), code), *v)


_TABLE = 128
_CODE_NAMES = {"?": "bool", "B": "u8", "b": "i8", "h": "i16", "H": "u16", "i": "i32", "I": "u32",
               "q": "i64", "d": "f64"}
_TABLES: dict[tuple[str, bool, str], list] = {}


def _array_table(code: str, unpack: bool, prefix: str) -> list:
    key = (code, unpack, prefix)
    tbl = _TABLES.get(key)
    if tbl is None:
        mk = (lambda s: s.unpack_from) if unpack else (lambda s: s.pack)
        tbl = _TABLES[key] = [mk(_struct.Struct(f">{prefix}{k}{code}")) for k in range(_TABLE)]
    return tbl


def _mark_present(o: Struct, tag: int) -> None:
    p = getattr(o, "_present", None)
    o._present = (p or frozenset()) | {tag}


BASE_NS: dict[str, Any] = {
    "_new": object.__new__, "_uv": read_uvarint, "_uvc": read_compact_prefix, "_uvl": _uvl,
    "_zz32": _zz32, "_zz64": _zz64, "_wuv": write_uvarint, "_wzz": _wzz, "_wup": _wup, "_ua": _ua,
    "_pa": _pa, "_DE": _derr, "_EE": EncodeError, "_ci": _check_int,
    "_mark": _mark_present, "_str": str, "_len": len, "_bytes": bytes, "_list": list,
    "_isinst": isinstance, "_Struct": Struct, "_range": range, "_mv": memoryview,
    "_ba": bytearray,
    "_ph": _struct.Struct(">h").pack, "_pi": _struct.Struct(">i").pack,
    "_uh": _struct.Struct(">h").unpack_from, "_ui": _struct.Struct(">i").unpack_from,
    "_ub": _struct.Struct(">b").unpack_from, "_getp": getattr,
    "_cv": check_value, "_NO": _Declined, "_type": type, "_int": int, "_bool": bool,
    "_float": float, "_map": map, "_set": set,
}
if _native is not None:
    BASE_NS["_ao"] = _native.all_of
    BASE_NS["_prun"] = _native.pack_run
    BASE_NS["_parr"] = _native.pack_array


# ---------------------------------------------------------------------------
# code generation


class _Unit:
    """Generates and compiles all functions of one (message, version, mode)."""

    def __init__(self, msg: MessageSpec, version: int, traced: bool):
        self.msg = msg
        self.version = version
        self.traced = traced
        self.flexible = msg.is_flexible(version)
        self.lines: list[str] = []
        self.ns: dict[str, Any] = dict(BASE_NS)
        self.done: dict[int, str] = {}
        self.nconst = 0
        self.ntmp = 0
        self.makers: dict[str, list[str]] = {}
        self.sids: dict[int, int] = {}
        self.zero: dict[int, bool] = {}
        #: whether some array's elements take no bytes (:meth:`zero_width`): the
        #: decoder then counts them against the bytes it was given (_compile)
        self.zero_budget = False

    # -- helpers -----------------------------------------------------------------
    def const(self, value: Any) -> str:
        """A literal for ints, bools and None; a namespace constant otherwise."""
        if value is None or type(value) in (bool, int):
            return repr(value)
        return self._c(value)

    def _c(self, value: Any) -> str:
        self.nconst += 1
        name = f"_k{self.nconst}"
        self.ns[name] = value
        return name

    def tmp(self, prefix: str = "x") -> str:
        self.ntmp += 1
        return f"{prefix}{self.ntmp}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def cls_name(self, st: StructSpec) -> str:
        struct_class(st)
        name = f"C_{st.name}_{self.sid(st)}"
        self.ns[name] = st.cls
        return name

    def fn(self, kind: str, st: StructSpec) -> str:
        return f"{kind}_{st.name}_{self.sid(st)}"

    def sid(self, st: StructSpec) -> int:
        """A number for ``st`` in this unit, in the order the walk meets the structs,
        so that the same spec always generates the same source (the code cache is
        keyed by it; ``id()`` would differ from run to run)."""
        return self.sids.setdefault(id(st), len(self.sids))

    def compact(self, f: FieldSpec) -> bool:
        if f.flexible_versions is not None:
            return f.flexible_versions.contains(self.version)
        return self.flexible

    def present(self, f: FieldSpec) -> bool:
        return f.versions.contains(self.version)

    def zero_width(self, st: StructSpec) -> bool:
        """Whether ``st`` takes no bytes on the wire at this version: the version is
        not flexible (a tag section takes at least one byte) and every field in it is
        a non-nullable struct (not an array) that takes none either, e.g. a struct
        whose fields all start at a later version."""
        got = self.zero.get(id(st))
        if got is None:
            got = self.zero[id(st)] = not self.flexible and all(
                not self.present(f) or (f.struct is not None and not f.is_array
                                        and not f.nullable_in(self.version)
                                        and self.zero_width(f.struct))
                for f in st.fields)
        return got

    # -- decode -------------------------------------------------------------------
    def gen_struct(self, st: StructSpec) -> None:
        if id(st) in self.done:
            return
        self.done[id(st)] = st.name
        for f in st.fields:
            if f.struct is not None and self.present(f):
                self.gen_struct(f.struct)
        self.gen_decode(st)
        self.gen_encode(st)

    def targ(self) -> str:
        return ", T" if self.traced else ""

    def gen_decode(self, st: StructSpec) -> None:
        self.emit(0, f"def {self.fn('d', st)}(buf, pos, end{self.targ()}):")
        self.decode_body(st, 1, "o")
        self.emit(1, "return o, pos")
        self.emit(0, "")
        if self.flexible:
            self.gen_tags(st, [f for f in st.fields if f.tagged_in(self.version)])

    def decode_body(self, st: StructSpec, ind: int, o: str) -> None:
        """Code that decodes one ``st`` at ``pos`` into the new variable ``o``."""
        v = self.version
        cls = self.cls_name(st)
        self.emit(ind, f"{o} = _new({cls})")
        fields = st.fields
        i = 0
        while i < len(fields):
            f = fields[i]
            if not self.present(f) or f.tagged_in(v):
                self.emit_default(ind, f, f"{o}.{_attr(f)}")
                i += 1
                continue
            if not self.traced:
                # a run of fixed-width fields, plus the length prefix of the variable-
                # length field after it, read with one precompiled struct format
                j = i
                while j < len(fields) and self.present(fields[j]) and \
                        not fields[j].tagged_in(v) and self.is_fixed(fields[j]):
                    j += 1
                run = fields[i:j]
                nxt = fields[j] if j < len(fields) else None
                if nxt is not None and not (self.present(nxt) and not nxt.tagged_in(v)):
                    nxt = None
                pfx = self.prefix_code(nxt) if nxt is not None else None
                tail_tags = (nxt is None and self.flexible and
                             all(not self.present(x) or x.tagged_in(v) for x in fields[j:]))
                if run and (len(run) > 1 or pfx is not None or tail_tags):
                    fmt = ">" + "".join(FIXED[x.type][0] for x in run)
                    size = sum(FIXED[x.type][1] for x in run)
                    targets = [f"{o}.{_attr(x)}" for x in run]
                    pv = None
                    if pfx is not None or tail_tags:
                        pv = self.tmp("p")
                        code = pfx or "B"
                        fmt += code
                        size += _struct.calcsize(">" + code)
                        targets.append(pv)
                    u = self._c(_struct.Struct(fmt).unpack_from)
                    self.emit(ind, f"{', '.join(targets)}, = {u}(buf, pos)")
                    self.emit(ind, f"pos += {size}")
                    if pv is not None and (pfx or "B") == "B":
                        self.emit(ind, f"if {pv} > 127:")
                        # a compact length prefix, or (pfx None) a tag count
                        self.uv_rest(ind + 1, pv, two=pfx is not None, length=pfx is not None)
                    if pfx is not None:
                        self.read_field(ind, nxt, f"{o}.{_attr(nxt)}", pre=pv)
                        i = j + 1
                        continue
                    i = j
                    if tail_tags:
                        for x in fields[j:]:
                            self.emit_default(ind, x, f"{o}.{_attr(x)}")
                        self.finish_decode(st, ind, o, pre=pv)
                        return
                    continue
            self.read_field(ind, f, f"{o}.{_attr(f)}")
            i += 1
        self.finish_decode(st, ind, o)

    def prefix_code(self, f: FieldSpec) -> str | None:
        """The struct code of a field's length prefix when it can be read together
        with a preceding fixed-width run (``B`` speculatively for a compact varint)."""
        if f.struct is not None and not f.is_array:
            return None
        if not (f.is_array or f.type in ("string", "bytes", "records")):
            return None
        if self.compact(f):
            return "B"
        return "h" if f.type == "string" else "i"

    def finish_decode(self, st: StructSpec, ind: int, o: str, pre: str | None = None) -> None:
        if self.flexible:
            n = self.tmp("c")
            if self.traced:
                self.emit(ind, "T.append(('<tagged fields>', pos, 'tag section'))")
            if pre is None and not self.traced:
                # almost every tag section is empty: one byte 0
                self.emit(ind, "if buf[pos]:")
                self.emit(ind + 1, f"{n}, pos = _uv(buf, pos)")
                self.emit(ind + 1, f"pos = {self.fn('t', st)}({o}, buf, pos, end, {n})")
                self.emit(ind, "else:")
                self.emit(ind + 1, "pos += 1")
                self.emit(ind + 1, f"{o}._unknown = None")
                return
            if pre is not None:
                n = pre
            else:
                self.read_uv(ind, n)
            self.emit(ind, f"if {n}:")
            self.emit(ind + 1, f"pos = {self.fn('t', st)}({o}, buf, pos, end, {n}{self.targ()})")
            self.emit(ind, "else:")
            self.emit(ind + 1, f"{o}._unknown = None")
            if self.traced:
                self.emit(ind, "T.pop()")
        else:
            self.emit(ind, f"{o}._unknown = None")

    def gen_tags(self, st: StructSpec, tagged: list[FieldSpec]) -> None:
        self.emit(0, f"def {self.fn('t', st)}(o, buf, pos, end, cnt{self.targ()}):")
        # As Kafka's generated readers: tags in any order; a tag of a field of this
        # struct that is not tagged at this version is an error ("Tag N is not valid
        # for version V"). Unlike them (a repeated tag overwrites the field or adds a
        # second unknown tag), a tag repeated within one section is an error here:
        # one value per tag is all a struct holds, so both could not be kept.
        self.emit(1, "u = None")
        self.emit(1, "seen = set()")
        self.emit(1, "for _ in _range(cnt):")
        self.emit(2, "tp = pos")
        self.read_uv(2, "t")
        self.read_uv(2, "sz")
        self.emit(2, "if t in seen:")
        self.emit(3, "raise _DE('tag %d repeated in one tag section' % t, 'each tag once', tp)")
        self.emit(2, "seen.add(t)")
        for f in sorted((f for f in st.fields if f.is_tagged and not f.tagged_in(self.version)),
                        key=lambda x: x.tag):
            self.emit(2, f"if t == {f.tag}:")
            self.emit(3, f"raise _DE('tag {f.tag} ({f.name}) is not valid for version "
                         f"{self.version}', 'a tag valid at version {self.version}', tp)")
        self.emit(2, "e = pos + sz")
        self.emit(2, "if e > end:")
        self.emit(3, "raise _DE('tagged field %d claims %d bytes, %d left' % (t, sz, end - pos), "
                     "'tagged field data', pos)")
        kw = "if"
        for f in sorted(tagged, key=lambda x: x.tag):
            self.emit(2, f"{kw} t == {f.tag}:")
            kw = "elif"
            if self.traced:
                self.emit(3, f"T.append(({f.name!r}, pos, {self.describe(f)!r}))")
            self.emit(3, "end0 = end")
            self.emit(3, "end = e")
            self.read_field(3, f, f"o.{_attr(f)}", in_tag=True)
            self.emit(3, "end = end0")
            self.emit(3, "if pos != e:")
            self.emit(4, f"raise _DE('tagged field {f.name} (tag {f.tag}) declared %d bytes but "
                         f"its value took %d' % (sz, pos - e + sz), 'tagged field of size')")
            if nan_default(f):
                self.emit(3, f"if o.{_attr(f)} != o.{_attr(f)}:")  # NaN: at its default
            else:
                self.emit(3, f"if o.{_attr(f)} == {self.default_cmp(f)}:")
            self.emit(4, f"_mark(o, {f.tag})")
            if self.traced:
                self.emit(3, "T.pop()")
        body = 3 if tagged else 2
        if tagged:
            self.emit(2, "else:")
        self.emit(body, "if u is None:")
        self.emit(body + 1, "u = {}")
        self.emit(body, "u[t] = buf[pos:e]")
        self.emit(body, "pos = e")
        self.emit(1, "o._unknown = u")
        self.emit(1, "return pos")
        self.emit(0, "")

    def is_fixed(self, f: FieldSpec) -> bool:
        return (not f.is_array and f.type in FIXED and
                (f.type not in _WIDTH_BITS or f.encoding_in(self.version) == "fixed"))

    def describe(self, f: FieldSpec) -> str:
        t = f.type
        if t in _WIDTH_BITS and f.encoding_in(self.version) != "fixed":
            return f"{f.encoding_in(self.version)} {t}"
        c = self.compact(f) or (f.is_tagged and f.tagged_in(self.version))
        if f.is_array or t in ("string", "bytes", "records"):
            return ("compact " if c else "") + ("nullable " if f.nullable_in(self.version) else "") + t
        return t

    def default_expr(self, f: FieldSpec) -> str:
        if f.is_array:
            return "None" if f.default_text == "null" else "[]"
        if f.struct is not None:
            if f.default_text == "null":
                return "None"
            return f"{self.maker(f.struct)}()"
        return self.const(f.default)

    def emit_default(self, ind: int, f: FieldSpec, target: str) -> None:
        """Assign the field's default; a struct default is built inline (no call)."""
        if f.struct is not None and not f.is_array and f.default_text != "null" \
                and not self.traced:
            x = self.tmp("d")
            self.emit(ind, f"{x} = _new({self.cls_name(f.struct)})")
            for sf in f.struct.fields:
                self.emit(ind, f"{x}.{_attr(sf)} = {self.default_expr(sf)}")
            self.emit(ind, f"{x}._unknown = None")
            self.emit(ind, f"{target} = {x}")
        else:
            self.emit(ind, f"{target} = {self.default_expr(f)}")

    def maker(self, st: StructSpec) -> str:
        """Name of a generated function returning a new ``st`` with every field at its
        default (cheaper than the keyword ``__init__``; used for absent and tagged
        struct fields)."""
        name = f"mk_{st.name}_{self.sid(st)}"
        if name in self.makers:
            return name
        self.makers[name] = []  # placeholder against recursion
        lines = [f"def {name}():", f"    o = _new({self.cls_name(st)})"]
        for f in st.fields:
            lines.append(f"    o.{_attr(f)} = {self.default_expr(f)}")
        lines += ["    o._unknown = None", "    return o", ""]
        self.makers[name] = lines
        return name

    def default_cmp(self, f: FieldSpec) -> str:
        """An expression equal to the field's default, for comparisons."""
        if f.is_array:
            return "None" if f.default_text == "null" else "[]"
        if f.struct is not None:
            if f.default_text == "null":
                return "None"
            return self._c(struct_class(f.struct)())
        return self.const(f.default)

    def read_uv(self, ind: int, var: str, two: bool = False, length: bool = False) -> None:
        """Read a uvarint into ``var``; one-byte values inline (and two-byte ones
        when ``two``: lengths of records and bytes), longer ones by :func:`read_uvarint`
        (by :func:`read_compact_prefix` when ``length``: a compact length prefix)."""
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, f"if {var} < 128:")
        self.emit(ind + 1, "pos += 1")
        self.emit(ind, "else:")
        self.emit(ind + 1, "pos += 1")
        self.uv_rest(ind + 1, var, two, length)

    def uv_rest(self, ind: int, var: str, two: bool, length: bool = False) -> None:
        """``var`` holds a first varint byte >= 128 just read; ``pos`` is after it.
        ``length``: a compact length prefix (values of 2^31 and above are read as
        Java reads them, see :func:`read_compact_prefix`; only varints of five bytes
        can hold them, so the inline one- and two-byte paths need no check)."""
        fn = "_uvc" if length else "_uv"
        if two and not self.traced:
            q = self.tmp("q")
            self.emit(ind, f"{q} = buf[pos]")
            self.emit(ind, f"if {q} < 128:")
            self.emit(ind + 1, f"{var} = ({var} & 127) | ({q} << 7)")
            self.emit(ind + 1, "pos += 1")
            self.emit(ind, "else:")
            self.emit(ind + 1, f"{var}, pos = {fn}(buf, pos - 1)")
        else:
            self.emit(ind, f"{var}, pos = {fn}(buf, pos - 1)")

    def read_len(self, ind: int, n: str, compact: bool, pre: str | None, code: str) -> None:
        """Put a length into ``n``: compact (uvarint minus one) or fixed ``code``;
        ``pre`` names a variable already holding the raw prefix."""
        if compact:
            if pre is None:
                self.read_uv(ind, n, two=True, length=True)
                self.emit(ind, f"{n} -= 1")
            else:
                self.emit(ind, f"{n} = {pre} - 1")
        elif pre is None:
            self.emit(ind, f"{n}, = {'_uh' if code == 'h' else '_ui'}(buf, pos)")
            self.emit(ind, f"pos += {2 if code == 'h' else 4}")
        else:
            self.emit(ind, f"{n} = {pre}")

    def read_field(self, ind: int, f: FieldSpec, target: str, in_tag: bool = False,
                   pre: str | None = None) -> None:
        v = self.version
        if self.traced and not in_tag:
            self.emit(ind, f"T.append(({f.name!r}, pos, {self.describe(f)!r}))")
        compact = True if in_tag else self.compact(f)
        nullable = f.nullable_in(v)
        if f.is_array:
            n = self.tmp("n")
            self.read_len(ind, n, compact, pre, "i")
            self.emit(ind, f"if {n} < 0:")
            if nullable:  # any negative length is null, as Kafka reads it
                self.emit(ind + 1, f"{target} = None")
            else:
                self.emit(ind + 1, f"raise _DE('null or negative length %d for a non-nullable "
                                   f"array' % {n}, 'array length >= 0')")
            et = f.element_type
            fixed_elems = et in FIXED and et != "uuid" and f.struct is None
            if not self.traced and fixed_elems:
                # the element size check bounds the count before allocating
                self.emit(ind, "else:")
                self.fixed_array(ind + 1, et, n, target, check=True)
                return
            if not self.traced:
                self.emit(ind, f"elif {n} == 0:")
                self.emit(ind + 1, f"{target} = []")
            self.emit(ind, f"elif {n} > end - pos:")
            self.emit(ind + 1, f"raise _DE('array length %d exceeds the %d bytes left' % "
                               f"({n}, end - pos), 'array length')")
            zero = f.struct is not None and self.zero_width(f.struct)
            if zero:
                # each such array could claim every byte left again, and nested
                # ones would build a number of elements that grows with the square
                # of the frame's size: all of them together may be at most as many
                # as the bytes the decode was given
                self.zero_budget = True
                self.emit(ind, f"elif {n} > _zw.n:")
                self.emit(ind + 1, f"raise _DE('array length %d of elements that take no "
                                   f"bytes: only %d more such elements are allowed (one per "
                                   f"byte decoded)' % ({n}, _zw.n), 'array length')")
            self.emit(ind, "else:")
            if zero:
                self.emit(ind + 1, f"_zw.n -= {n}")
            if f.struct is not None:
                sub = self.fn("d", f.struct)
                a = self.tmp("a")
                self.emit(ind + 1, f"{a} = []")
                if self.traced:
                    self.emit(ind + 1, f"for i in _range({n}):")
                    self.emit(ind + 2, "T.append(('[%d]' % i, pos, 'element'))")
                    self.emit(ind + 2, f"x, pos = {sub}(buf, pos, end, T)")
                    self.emit(ind + 2, f"{a}.append(x)")
                    self.emit(ind + 2, "T.pop()")
                else:
                    ap = self.tmp("ap")
                    x = self.tmp("x")
                    self.emit(ind + 1, f"{ap} = {a}.append")
                    loop_ind = ind + 1
                    if self.batchable(f.struct):
                        loop_ind = self.batch_decode(ind + 1, f.struct, n, a, ap)
                    self.emit(loop_ind, f"for _ in _range({n}):")
                    self.decode_body(f.struct, loop_ind + 1, x)
                    self.emit(loop_ind + 1, f"{ap}({x})")
                self.emit(ind + 1, f"{target} = {a}")
            elif fixed_elems:  # (the count was checked against the bytes left above)
                self.fixed_array(ind + 1, et, n, target, check=FIXED[et][1] > 1)
            else:
                a = self.tmp("a")
                self.emit(ind + 1, f"{a} = []")
                self.emit(ind + 1, f"for _ in _range({n}):")
                self.read_prim(ind + 2, et, "x", compact, False, f, element=True)
                self.emit(ind + 2, f"{a}.append(x)")
                self.emit(ind + 1, f"{target} = {a}")
        elif f.struct is not None:
            sub = self.fn("d", f.struct)
            if nullable:
                # the presence marker as Kafka's generated readers take it: a tagged
                # one is an unsigned varint read into a Java int, null when <= 0 (0,
                # or 2^31 and above); an untagged one an int8, null when negative.
                # Anything else (not only 1) means present.
                m = self.tmp("m")
                if in_tag:
                    self.read_uv(ind, m)
                    self.emit(ind, f"if {m} == 0 or {m} > 2147483647:")
                else:
                    self.emit(ind, f"{m} = buf[pos]")
                    self.emit(ind, "pos += 1")
                    self.emit(ind, f"if {m} > 127:")
                self.emit(ind + 1, f"{target} = None")
                self.emit(ind, "else:")
                self.struct_value(ind + 1, f, target, sub, in_tag)
            else:
                self.struct_value(ind, f, target, sub, in_tag)
        else:
            self.read_prim(ind, f.type, target, compact, nullable, f, pre=pre)
        if self.traced and not in_tag:
            self.emit(ind, "T.pop()")

    def fixed_array(self, ind: int, et: str, n: str, target: str, check: bool) -> None:
        """Read ``n`` fixed-width ``et`` elements into ``target`` with one
        precompiled struct call; ``check``: first make sure they fit in the bytes
        left (before anything is allocated)."""
        code, size = FIXED[et]
        e = self.tmp("e")
        self.emit(ind, f"{e} = pos + {n} * {size}" if size > 1 else f"{e} = pos + {n}")
        if check:
            self.emit(ind, f"if {e} > end:")
            self.emit(ind + 1, f"raise _DE('array of %d {et} exceeds the %d bytes left' % "
                               f"({n}, end - pos), 'array of {et}')")
        tbl = self.array_table(code, unpack=True)
        self.emit(ind, f"{target} = [*{tbl}[{n}](buf, pos)] if {n} < {_TABLE} "
                       f"else _ua({code!r}, {n}, buf, pos)")
        self.emit(ind, f"pos = {e}")

    def batchable(self, st: StructSpec) -> bool:
        """Elements whose wire form is fixed-width (plus an empty tag section)."""
        v = self.version
        wire = [f for f in st.fields if self.present(f) and not f.tagged_in(v)]
        return bool(wire) and all(self.is_fixed(f) for f in wire)

    def batch_decode(self, ind: int, st: StructSpec, n: str, a: str, ap: str) -> int:
        """Decode an array of fixed-width elements with one precompiled struct of one
        element (``iter_unpack`` over a view of the bytes, nothing copied or cached
        per count) when every element has an empty tag section; returns the indent of
        the general loop that runs otherwise."""
        v = self.version
        wire = [f for f in st.fields if self.present(f) and not f.tagged_in(v)]
        fmt = "".join(FIXED[f.type][0] for f in wire) + ("B" if self.flexible else "")
        size = _struct.calcsize(">" + fmt)
        it, e = self._c(_struct.Struct(">" + fmt).iter_unpack), self.tmp("e")
        self.emit(ind, f"{e} = pos + {n} * {size}")
        cond = f"{n} > 2 and {e} <= end"
        if self.flexible:
            # every element's tag section (its last byte) is empty
            cond += f" and buf[pos + {size - 1}:{e}:{size}].count(0) == {n}"
        self.emit(ind, f"if {cond}:")
        names = [self.tmp("f") for _ in wire] + (["_"] if self.flexible else [])
        self.emit(ind + 1, f"for {', '.join(names)}, in {it}(_mv(buf)[pos:{e}]):")
        x = self.tmp("x")
        self.emit(ind + 2, f"{x} = _new({self.cls_name(st)})")
        for f in st.fields:
            if f in wire:
                self.emit(ind + 2, f"{x}.{_attr(f)} = {names[wire.index(f)]}")
            else:
                self.emit(ind + 2, f"{x}.{_attr(f)} = {self.default_expr(f)}")
        self.emit(ind + 2, f"{x}._unknown = None")
        self.emit(ind + 2, f"{ap}({x})")
        self.emit(ind + 1, f"pos = {e}")
        self.emit(ind, "else:")
        return ind + 1

    def struct_value(self, ind: int, f: FieldSpec, target: str, sub: str, in_tag: bool) -> None:
        if self.traced or in_tag:
            self.emit(ind, f"{target}, pos = {sub}(buf, pos, end{self.targ()})")
        else:
            x = self.tmp("s")
            self.decode_body(f.struct, ind, x)
            self.emit(ind, f"{target} = {x}")

    def array_table(self, code: str, unpack: bool, prefix: str = "") -> str:
        """Namespace name of a list of precompiled struct functions for arrays of
        0.._TABLE-1 elements of ``code`` (optionally after a ``prefix`` length code)."""
        name = f"_{'U' if unpack else 'P'}{prefix}_{_CODE_NAMES[code]}"
        if name not in self.ns:
            self.ns[name] = _array_table(code, unpack, prefix)
        return name

    def read_prim(self, ind: int, t: str, target: str, compact: bool, nullable: bool,
                  f: FieldSpec, element: bool = False, pre: str | None = None) -> None:
        if t in FIXED:
            enc = "fixed" if element or t not in _WIDTH_BITS else f.encoding_in(self.version)
            if enc == "packed":
                self.emit(ind, f"{target}, pos = {'_zz64' if t == 'int64' else '_zz32'}(buf, pos)")
                lo, hi = INT_RANGES[t]
                self.emit(ind, f"if not {lo} <= {target} <= {hi}:")
                self.emit(ind + 1, f"raise _DE('varint value out of range for {t}', 'packed {t}')")
                return
            if enc == "upacked":
                self.emit(ind, f"{target}, pos = {'_uvl' if t == 'int64' else '_uv'}(buf, pos)")
                lo, hi = INT_RANGES[t]
                self.emit(ind, f"if {target} > {hi}:")
                self.emit(ind + 1, f"raise _DE('varint value out of range for {t}', 'upacked {t}')")
                return
            code, size = FIXED[t]
            u = self._c(_struct.Struct(">" + code).unpack_from)
            if self.traced:
                self.emit(ind, f"if pos + {size} > end:")
                self.emit(ind + 1, f"raise _DE('truncated: %d bytes left' % (end - pos), {t!r})")
            self.emit(ind, f"{target}, = {u}(buf, pos)")
            self.emit(ind, f"pos += {size}")
            return
        # string, bytes, records
        n = self.tmp("n")
        self.read_len(ind, n, compact, pre, "h" if t == "string" else "i")
        kind = ("compact " if compact else "") + t
        self.emit(ind, f"if {n} < 0:")
        if nullable:  # any negative length is null, as Kafka reads it
            self.emit(ind + 1, f"{target} = None")
        else:
            self.emit(ind + 1, f"raise _DE('null or negative length %d for a non-nullable {t}' "
                               f"% {n}, 'non-null {kind}')")
        self.emit(ind, "else:")
        if t == "string" and compact:
            # Kafka: "string field X had invalid length" (an int16 one cannot be)
            self.emit(ind + 1, f"if {n} > 32767:")
            self.emit(ind + 2, f"raise _DE('string length %d is longer than 32767' % {n}, "
                               f"'{kind} of at most 32767 bytes')")
        e = self.tmp("e")
        self.emit(ind + 1, f"{e} = pos + {n}")
        self.emit(ind + 1, f"if {e} > end:")
        self.emit(ind + 2, f"raise _DE('{t} length %d exceeds the %d bytes left' % "
                           f"({n}, end - pos), '{kind} data')")
        if t == "string":
            self.emit(ind + 1, f"{target} = buf[pos:{e}].decode('utf-8', 'surrogateescape')")
        else:
            self.emit(ind + 1, f"{target} = buf[pos:{e}]")
        self.emit(ind + 1, f"pos = {e}")

    # -- encode -------------------------------------------------------------------
    def gen_encode(self, st: StructSpec) -> None:
        self.emit(0, f"def {self.fn('e', st)}(o, out{self.targ()}):")
        self.encode_body(st, 1, "o")
        self.emit(0, "")

    def encode_body(self, st: StructSpec, ind: int, o: str) -> None:
        """Code that appends the encoding of struct ``o`` to ``out``. It always emits
        at least one statement (the tag section, or the check that no tags were set),
        so it can be the whole body of a block."""
        v = self.version
        fields = st.fields
        i = 0
        while i < len(fields):
            f = fields[i]
            if not self.present(f):
                self.check_absent(ind, f, o)
                i += 1
                continue
            if f.tagged_in(v):
                i += 1
                continue
            if not self.traced and self.is_fixed(f) and f.type != "uuid":
                run = [f]
                j = i + 1
                while j < len(fields) and self.present(fields[j]) and \
                        not fields[j].tagged_in(v) and self.is_fixed(fields[j]) and \
                        fields[j].type != "uuid":
                    run.append(fields[j])
                    j += 1
                codes = "".join(_ecode(x.type) for x in run)
                # struct.pack takes bools for ints and ints 0..255 for bools ("B"):
                # exact types here, anything else is left to the traced encoder
                # (which applies check_value)
                if _native is not None and len(run) <= 64:
                    # one C call checks and appends the run (False: declined)
                    args = ", ".join(f"{o}.{_attr(x)}" for x in run)
                    self.emit(ind, f"if not _prun(out, {self._c(codes.encode())}, {args}):")
                    self.emit(ind + 1, "raise _NO")
                    i = j
                    continue
                p = self._c(_struct.Struct(">" + codes).pack)
                names = [self.tmp("a") for _ in run]
                for n, x in zip(names, run):
                    self.emit(ind, f"{n} = {o}.{_attr(x)}")
                cond = " or ".join(f"_type({n}) is not {_FAST_TYPE[x.type]}"
                                   for n, x in zip(names, run))
                self.emit(ind, f"if {cond}:")
                self.emit(ind + 1, "raise _NO")
                self.emit(ind, f"out += {p}({', '.join(names)})")
                i = j
                continue
            self.write_field(ind, f, f"{o}.{_attr(f)}")
            i += 1
        if self.flexible:
            self.write_tags(ind, st, o)
        else:
            # as Kafka's generated writers (UnsupportedVersionException): tags set on a
            # struct cannot be written in a version without tag sections
            self.emit(ind, f"if {o}._unknown:")
            self.emit(ind + 1, f"raise _EE('tagged fields %s were set, but version {self.version} "
                               f"does not support tagged fields' % sorted({o}._unknown))")

    def check_absent(self, ind: int, f: FieldSpec, o: str = "o") -> bool:
        if f.ignorable:
            return False
        val = f"{o}.{_attr(f)}"
        self.emit(ind, f"if {self.nondefault(f, val)}:")
        self.emit(ind + 1, f"raise _EE('non-default value %r for field {f.name}, which version "
                           f"{self.version} does not have and which is not ignorable' % ({val},), "
                           f"{f.name!r})")
        return True

    def write_tags(self, ind: int, st: StructSpec, o: str = "o") -> None:
        v = self.version
        self.ns["_wtags"] = _write_tags
        self.ns["_k0"] = _tag_key
        self.ns["_unk"] = _unknown_items
        self.ns["_nothing"] = frozenset()
        tagged = sorted((f for f in st.fields if f.tagged_in(v)), key=lambda x: x.tag)
        # tags of fields (tagged at this version or another): not for unknown tags,
        # except a ForeignTag of a field that is not tagged at this version
        reserved = frozenset(f.tag for f in st.fields if f.is_tagged)
        now = frozenset(f.tag for f in tagged)
        u = self.tmp("u")
        if not tagged:
            self.emit(ind, f"{u} = {o}._unknown")
            self.emit(ind, f"if {u}:")
            if reserved:
                self.emit(ind + 1, f"_wtags(out, _unk({u}, {self._c(reserved)}, "
                                   f"{self._c(now)}))")
            else:
                self.emit(ind + 1, f"_wtags(out, _unk({u}, _nothing))")
            self.emit(ind, "else:")
            self.emit(ind + 1, "out.append(0)")
            return
        tg, pr, b = self.tmp("tg"), self.tmp("pr"), self.tmp("b")
        self.emit(ind, f"{tg} = []")
        self.emit(ind, f"{pr} = _getp({o}, '_present', None)")
        for f in tagged:
            val = f"{o}.{_attr(f)}"
            self.emit(ind, f"if {self.nondefault(f, val)} or ({pr} and {f.tag} in {pr}):")
            if self.traced:
                self.emit(ind + 1, f"T.append(({f.name!r}, len(out), {self.describe(f)!r}))")
            self.emit(ind + 1, f"{b} = out")
            self.emit(ind + 1, "out = bytearray()")
            self.write_field(ind + 1, f, val, in_tag=True)
            self.emit(ind + 1, f"{tg}.append(({f.tag}, out))")
            self.emit(ind + 1, f"out = {b}")
            if self.traced:
                self.emit(ind + 1, "T.pop()")
        self.emit(ind, f"{u} = {o}._unknown")
        self.emit(ind, f"if {u}:")
        self.emit(ind + 1, f"{tg}.extend(_unk({u}, {self._c(reserved)}, {self._c(now)}))")
        self.emit(ind + 1, f"{tg}.sort(key=_k0)")
        self.emit(ind, f"if {tg}:")
        self.emit(ind + 1, f"_wtags(out, {tg})")
        self.emit(ind, "else:")
        self.emit(ind + 1, "out.append(0)")

    def nondefault(self, f: FieldSpec, val: str, depth: int = 0) -> str:
        """An expression true when ``val`` (the value of ``f``) differs from the
        field's default, comparing struct defaults field by field inline."""
        if f.is_array:
            return f"{val} is not None" if f.default_text == "null" else f"{val} != []"
        if f.struct is not None:
            if f.default_text == "null":
                return f"{val} is not None"
            if depth >= 2 or len(f.struct.fields) > 8:
                return f"{val} != {self.default_cmp(f)}"
            parts = [f"{val} is None"]
            parts += [self.nondefault(sf, f"{val}.{_attr(sf)}", depth + 1)
                      for sf in f.struct.fields]
            parts.append(f"{val}._unknown")
            return "(" + " or ".join(parts) + ")"
        if nan_default(f):  # any NaN is the default: NaN != NaN
            return f"{val} == {val}"
        return f"{val} != {self.const(f.default)}"

    def write_uv(self, ind: int, expr: str) -> None:
        n = self.tmp("w")
        self.emit(ind, f"{n} = {expr}")
        self.emit(ind, f"if {n} < 128:")
        self.emit(ind + 1, f"out.append({n})")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"_wuv(out, {n})")

    def write_field(self, ind: int, f: FieldSpec, val: str, in_tag: bool = False) -> None:
        v = self.version
        if self.traced and not in_tag:
            self.emit(ind, f"T.append(({f.name!r}, len(out), {self.describe(f)!r}))")
        compact = True if in_tag else self.compact(f)
        nullable = f.nullable_in(v)
        x = self.tmp("v")
        self.emit(ind, f"{x} = {val}")
        if f.is_array:
            self.emit(ind, f"if {x} is None:")
            if nullable:
                self.emit(ind + 1, "out.append(0)" if compact else "out += b'\\xff\\xff\\xff\\xff'")
            else:
                self.emit(ind + 1, f"raise _EE('null for non-nullable array {f.name}', "
                                   f"{f.name!r})")
            self.emit(ind, "else:")
            et = f.element_type
            # the array: a list (a str or bytes would be taken as a sequence), its
            # elements of exactly their type in the fast encoder (pack takes bools for
            # ints; structs of another class could have the same slots)
            elem_type = (self.cls_name(f.struct) if f.struct is not None else
                         _FAST_TYPE.get(et) or ("_str" if et == "string" else None))
            fixed_elems = et in FIXED and et != "uuid" and f.struct is None
            if self.traced:
                self.emit(ind + 1, f"if not _isinst({x}, (list, tuple)):")
                self.emit(ind + 2, f"raise _EE('expected a list, got %s' % type({x}).__name__)")
            elif _native is not None and fixed_elems:
                # one C call checks and appends length and elements (False: declined)
                code = self._c(_ecode(et).encode())
                self.emit(ind + 1, f"if not _parr(out, {code}, {compact}, {x}):")
                self.emit(ind + 2, "raise _NO")
                return
            elif _native is not None and elem_type is not None:
                self.emit(ind + 1, f"if not _ao({elem_type}, {x}):")  # one C call
                self.emit(ind + 2, "raise _NO")
            else:
                self.emit(ind + 1, f"if _type({x}) is not _list:")
                self.emit(ind + 2, "raise _NO")
            if not self.traced and et in FIXED and et != "uuid" and f.struct is None:
                # length prefix and elements packed with one precompiled struct
                if _native is None:
                    only = self._c(frozenset({_FAST_PY[et]}))
                    self.emit(ind + 1, f"if {x} and _set(_map(_type, {x})) != {only}:")
                    self.emit(ind + 2, "raise _NO")
                code = _ecode(et)
                k = self.tmp("k")
                self.emit(ind + 1, f"{k} = len({x})")
                if compact:
                    tbl = self.array_table(code, unpack=False, prefix="B")
                    self.emit(ind + 1, f"if {k} < {min(_TABLE, 127)}:")
                    self.emit(ind + 2, f"out += {tbl}[{k}]({k} + 1, *{x})")
                    self.emit(ind + 1, "else:")
                    self.emit(ind + 2, f"_wuv(out, {k} + 1)")
                else:
                    tbl = self.array_table(code, unpack=False, prefix="i")
                    self.emit(ind + 1, f"if {k} < {_TABLE}:")
                    self.emit(ind + 2, f"out += {tbl}[{k}]({k}, *{x})")
                    self.emit(ind + 1, "else:")
                    self.emit(ind + 2, f"out += _pi({k})")
                self.emit(ind + 2, f"out += _pa({code!r}, {x})")
                if self.traced and not in_tag:
                    self.emit(ind, "T.pop()")
                return
            if compact:
                self.write_uv(ind + 1, f"len({x}) + 1")
            else:
                self.emit(ind + 1, f"out += _pi(len({x}))")
            if f.struct is not None:
                sub = self.fn("e", f.struct)
                if self.traced:
                    self.emit(ind + 1, f"for i, y in enumerate({x}):")
                    self.emit(ind + 2, "T.append(('[%d]' % i, len(out), 'element'))")
                    self.emit(ind + 2, f"if not _isinst(y, {self.cls_name(f.struct)}):")
                    self.emit(ind + 3, f"raise _EE('expected a {f.struct.name}, got %s' % "
                                       f"type(y).__name__)")
                    self.emit(ind + 2, f"{sub}(y, out, T)")
                    self.emit(ind + 2, "T.pop()")
                else:
                    y = self.tmp("y")
                    self.emit(ind + 1, f"for {y} in {x}:")
                    if _native is None:  # (checked by _ao above otherwise)
                        self.emit(ind + 2, f"if _type({y}) is not {self.cls_name(f.struct)}:")
                        self.emit(ind + 3, "raise _NO")
                    self.encode_body(f.struct, ind + 2, y)
            elif et in FIXED and et != "uuid":  # (traced only: the fast one returned above)
                code = _ecode(et)
                self.emit(ind + 1, f"for y in {x}:")
                self.emit(ind + 2, f"_cv(y, {et!r})")
                self.emit(ind + 1, f"out += _pa({code!r}, {x})")
            else:
                self.emit(ind + 1, f"for y in {x}:")
                self.write_prim(ind + 2, et, "y", compact, False, f, element=True)
        elif f.struct is not None:
            sub = self.fn("e", f.struct)
            if nullable:
                self.emit(ind, f"if {x} is None:")
                self.emit(ind + 1, "out.append(0)" if in_tag else "out.append(255)")
                self.emit(ind, "else:")
                self.emit(ind + 1, "out.append(1)")
                ind2 = ind + 1
            else:
                ind2 = ind
            if self.traced:
                self.emit(ind2, f"if not _isinst({x}, {self.cls_name(f.struct)}):")
                self.emit(ind2 + 1, f"raise _EE('expected a {f.struct.name}, got %s' % "
                                    f"type({x}).__name__)")
            if self.traced:
                self.emit(ind2, f"{sub}({x}, out, T)")
            else:
                self.emit(ind2, f"if _type({x}) is not {self.cls_name(f.struct)}:")
                self.emit(ind2 + 1, "raise _NO")
                self.encode_body(f.struct, ind2, x)
        else:
            self.write_prim(ind, f.type, x, compact, nullable, f)
        if self.traced and not in_tag:
            self.emit(ind, "T.pop()")

    def write_prim(self, ind: int, t: str, x: str, compact: bool, nullable: bool,
                   f: FieldSpec, element: bool = False) -> None:
        if t in FIXED:
            enc = "fixed" if element or t not in _WIDTH_BITS else f.encoding_in(self.version)
            if self.traced:
                self.emit(ind, f"_cv({x}, {t!r})")
            elif enc == "fixed" and t != "uuid":
                self.emit(ind, f"if _type({x}) is not {_FAST_TYPE[t]}:")
                self.emit(ind + 1, "raise _NO")
            if enc == "packed":
                self.emit(ind, f"_wzz(out, {x}, {_WIDTH_BITS[t]})")
            elif enc == "upacked":
                self.emit(ind, f"_wup(out, {x}, {_WIDTH_BITS[t]})")
            elif t == "uuid":
                if self.traced:  # (_cv checked it; a memoryview is written as its bytes)
                    self.emit(ind, f"out += _bytes({x}) if _isinst({x}, _mv) else {x}")
                else:
                    # bytes of 16 bytes only: any other buffer (a bytearray, a memoryview,
                    # whose len() counts items, not bytes) is left to the traced encoder
                    self.emit(ind, f"if _type({x}) is not _bytes or len({x}) != 16:")
                    self.emit(ind + 1, "raise _NO")
                    self.emit(ind, f"out += {x}")
            else:
                p = self._c(_struct.Struct(">" + _ecode(t)).pack)
                self.emit(ind, f"out += {p}({x})")
            return
        self.emit(ind, f"if {x} is None:")
        if nullable:
            if compact:
                self.emit(ind + 1, "out.append(0)")
            else:
                self.emit(ind + 1, "out += b'\\xff\\xff'" if t == "string" else
                          "out += b'\\xff\\xff\\xff\\xff'")
        else:
            self.emit(ind + 1, f"raise _EE('null for non-nullable {t} field {f.name}', "
                               f"{f.name!r})")
        self.emit(ind, "else:")
        b = self.tmp("b")
        if t == "string":
            if self.traced:
                self.emit(ind + 1, f"if not _isinst({x}, str):")
                self.emit(ind + 2, f"raise _EE('expected a string, got %s' % type({x}).__name__)")
            self.emit(ind + 1, f"{b} = {x}.encode('utf-8', 'surrogateescape')")
        else:
            if self.traced:
                self.emit(ind + 1, f"if not _isinst({x}, (bytes, bytearray, memoryview)):")
                self.emit(ind + 2, f"raise _EE('expected bytes, got %s' % type({x}).__name__)")
                # its bytes: len() of a memoryview counts items (4 for 16 bytes of int32)
                self.emit(ind + 1, f"{b} = _bytes({x}) if _isinst({x}, _mv) else {x}")
            else:
                # bytes or a bytearray only (len() is their byte count): any other
                # buffer is left to the traced encoder
                self.emit(ind + 1, f"{b} = {x}")
                self.emit(ind + 1, f"if _type({b}) is not _bytes and _type({b}) is not _ba:")
                self.emit(ind + 2, "raise _NO")
        if t == "string":  # Kafka: "'X' field is too long to be serialized"
            self.emit(ind + 1, f"if len({b}) > 32767:")
            self.emit(ind + 2, f"raise _EE('string of %d bytes is longer than 32767' % len({b}))")
        if compact:
            self.write_uv(ind + 1, f"len({b}) + 1")
        elif t == "string":
            self.emit(ind + 1, f"out += _ph(len({b}))")
        else:
            self.emit(ind + 1, f"out += _pi(len({b}))")
        self.emit(ind + 1, f"out += {b}")


def _tag_key(item: tuple[int, Any]) -> int:
    return item[0]


class ForeignTag(int):
    """An unknown tag number meant to be written although a field of its struct has
    that tag at another version (``taggedVersions``): the tag a later version
    defines, sent to a version without it to see whether a peer skips it as KIP-482
    says or reads it by number (kinspect's and Kafka's generated readers refuse it:
    "tag N is not valid for version V"). Used by the tagged-field rules and
    ``kinspect tolerate``; the tag of a field tagged at the version written stays an
    :class:`~kinspect.codec.errors.EncodeError`."""

    __slots__ = ()


def _unknown_items(u: dict[int, bytes], reserved: frozenset[int],
                   now: frozenset[int] = frozenset()) -> list[tuple[int, bytes]]:
    """The unknown tagged fields ``u`` of a struct, in tag order, none of them with
    the tag of one of its fields (``reserved``): a reader takes such a tag for the
    field (or, at a version where the field is not tagged, refuses it), so it
    could not come back as the unknown tag it was. A :class:`ForeignTag` of a field
    not tagged at this version (not in ``now``) is written all the same.

    Data may be ``bytes``, ``bytearray`` or a ``memoryview`` (written as the bytes it
    views, whatever its item format).

    Raises:
        EncodeError: a tag of ``reserved``; data of another type.
    """
    items = []
    for tag, data in u.items():
        if tag in reserved and (tag in now or type(tag) is not ForeignTag):
            raise EncodeError(f"unknown tagged field {tag} has the tag of a field of this "
                              f"struct (set the field instead)")
        items.append((tag, data if type(data) is bytes else tag_data(tag, data)))
    items.sort(key=_tag_key)
    return items


def tag_data(tag: int, data: Any) -> bytes | bytearray:
    """The bytes to write for unknown tagged field ``tag`` holding ``data``: ``bytes``
    or ``bytearray`` as they are, a ``memoryview`` as the bytes it views (its len()
    counts items, not bytes).

    Raises:
        EncodeError: data of another type.
    """
    if isinstance(data, memoryview):
        return data.tobytes()
    if isinstance(data, (bytes, bytearray)):
        return data
    raise EncodeError(f"unknown tagged field {tag}: data must be bytes, not "
                      f"{type(data).__name__}")


def _write_tags(out: bytearray, tags: list[tuple[int, bytes]]) -> None:
    """A tag section (KIP-482): the count, then each ``(tag, data)`` as unsigned
    varints of the tag and data size, and the data.

    Raises:
        EncodeError: a tag outside 0..2^32-1 (readers take it as an unsigned 32-bit
            varint) or repeated.
    """
    write_uvarint(out, len(tags))
    last = -1
    for tag, data in tags:
        if not 0 <= tag <= 0xFFFFFFFF:
            raise EncodeError(f"tag {tag} outside 0..4294967295 (an unsigned 32-bit varint)")
        if tag <= last:
            raise EncodeError(f"duplicate tag {tag}")
        last = tag
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data


class CompiledVersion:
    """The decode and encode functions of one message at one version, and the
    native decode program (``None`` where the C fast path is not available)."""

    __slots__ = ("decode", "encode", "decode_traced", "encode_traced", "source", "native")

    def __init__(self, msg: MessageSpec, version: int):
        self.decode, self.encode, self.source, self.native = _compile(msg, version, traced=False)
        self.decode_traced = None
        self.encode_traced = None

    def traced(self, msg: MessageSpec, version: int) -> None:
        if self.decode_traced is None:
            self.decode_traced, self.encode_traced, _, _ = _compile(msg, version, traced=True)


def _compile(msg: MessageSpec, version: int, traced: bool):
    unit = _Unit(msg, version, traced)
    unit.gen_struct(msg.struct)
    for lines in unit.makers.values():
        unit.lines.extend(lines)
    root = unit.fn("d", msg.struct)
    if unit.zero_budget:
        # elements that take no bytes are counted against the bytes given, per decode
        # (per thread: the functions are shared)
        unit.ns["_zw"] = threading.local()
        unit.emit(0, f"def {root}_entry(buf, pos, end{unit.targ()}):")
        unit.emit(1, "_zw.n = end - pos")
        unit.emit(1, f"return {root}(buf, pos, end{unit.targ()})")
        root += "_entry"
    source = "\n".join(unit.lines)
    code = compile_cached(source, f"<kinspect {msg.name} v{version}{' traced' if traced else ''}>")
    exec(code, unit.ns)
    native = None
    if _native is not None and not traced:
        native = _NativeBuilder(unit).program(msg.struct, wire=True)
    return unit.ns[root], unit.ns[unit.fn("e", msg.struct)], source, native


# ---------------------------------------------------------------------------
# programs for the C fast path (kinspect/codec/_native.c)

_NATIVE_TYPES = {"bool": "T_BOOL", "int8": "T_I8", "int16": "T_I16", "uint16": "T_U16",
                 "int32": "T_I32", "uint32": "T_U32", "int64": "T_I64", "float64": "T_F64",
                 "uuid": "T_UUID", "string": "T_STR", "bytes": "T_BYTES", "records": "T_BYTES"}


class _NativeBuilder:
    """Turns the decisions of a fast :class:`_Unit` (which fields are on the wire at
    its version, compact or not, nullable or not, tagged or not, their encodings and
    defaults) into :class:`kinspect.codec._native.Program` objects. Non-empty tag
    sections stay with the unit's generated ``t_*`` functions."""

    def __init__(self, unit: _Unit):
        self.unit = unit
        self.done: dict[tuple[int, bool], Any] = {}

    def program(self, st: StructSpec, wire: bool) -> Any:
        """The program of ``st``: how it is read at the unit's version (``wire``), or
        only how its default instance is built."""
        key = (id(st), wire)
        pg = self.done.get(key)
        if pg is not None:
            return pg
        pg = self.done[key] = _native.Program(struct_class(st))
        u = self.unit
        ops = [self.op(f) for f in st.fields] if wire else []
        defaults = [self.default_op(f) for f in st.fields]
        flexible = wire and u.flexible
        invalid = tuple(sorted(f.tag for f in st.fields
                               if f.is_tagged and not f.tagged_in(u.version)))
        pg.setup(ops, defaults, flexible, u.ns[u.fn("t", st)] if flexible else None,
                 invalid if flexible else ())
        return pg

    @staticmethod
    def _t(name: str) -> int:
        return getattr(_native, _NATIVE_TYPES[name])

    def op(self, f: FieldSpec) -> tuple:
        u, v, N = self.unit, self.unit.version, _native
        if not u.present(f) or f.tagged_in(v):
            return self.default_op(f)
        compact, nullable = u.compact(f), f.nullable_in(v)
        if f.is_array:
            if f.struct is not None:
                return (N.K_ARRAY, f.name, 0, compact, nullable, 0, None,
                        self.program(f.struct, wire=True))
            return (N.K_ARRAY, f.name, self._t(f.element_type), compact, nullable, 0, None, None)
        if f.struct is not None:
            return (N.K_STRUCT, f.name, 0, False, nullable, 0, None,
                    self.program(f.struct, wire=True))
        if f.type in ("string", "bytes", "records"):
            kind = N.K_STRING if f.type == "string" else N.K_BYTES
            return (kind, f.name, 0, compact, nullable, 0, None, None)
        if u.is_fixed(f):
            return (N.K_FIXED, f.name, self._t(f.type), False, False, 0, None, None)
        kind = N.K_PACKED if f.encoding_in(v) == "packed" else N.K_UPACKED
        return (kind, f.name, 0, False, False, _WIDTH_BITS[f.type], None, None)

    def default_op(self, f: FieldSpec) -> tuple:
        """Mirrors :meth:`_Unit.default_expr`: ``[]`` and default structs are new
        objects each time, everything else a shared immutable constant."""
        N = _native
        if f.is_array and f.default_text != "null":
            return (N.K_NEWLIST, f.name, 0, False, False, 0, None, None)
        if f.struct is not None and not f.is_array and f.default_text != "null":
            return (N.K_NEWSTRUCT, f.name, 0, False, False, 0, None,
                    self.program(f.struct, wire=False))
        value = None if f.is_array or f.struct is not None else f.default
        return (N.K_CONST, f.name, 0, False, False, 0, value, None)
