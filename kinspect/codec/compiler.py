"""Per-(struct, version) Python code generated from message specs.

For each message version two variants are generated and compiled once with
``exec``:

* the *fast* variant: fixed-width runs read with one precompiled
  :class:`struct.Struct`, varints read inline, bounds checked only where a short
  slice or an allocation could otherwise pass silently (lengths and counts are
  checked against the bytes left *before* anything is allocated, KAFKA-14063);
* the *traced* variant: every field checked and pushed on a trace stack. It runs
  only after the fast variant failed, to turn whatever went wrong into a
  :class:`~kinspect.codec.errors.DecodeError` (or ``EncodeError``) carrying the
  field path, byte offset and what was expected.

Wire formats follow the Kafka protocol guide and KIP-482 (tagged fields, compact
types, unsigned varints), KIP-893 (nullable structs) and the proposed per-field
``encoding`` property (fixedN / packedN zig-zag varint / upackedN unsigned varint).
"""

from __future__ import annotations

import struct as _struct
from typing import Any, Callable

from .errors import DecodeError, EncodeError
from .spec import INT_RANGES, FieldSpec, MessageSpec, StructSpec
from .values import Struct, struct_class

# (struct format char, size) of fixed-width primitives
FIXED = {
    "bool": ("?", 1), "int8": ("b", 1), "int16": ("h", 2), "uint16": ("H", 2),
    "int32": ("i", 4), "uint32": ("I", 4), "int64": ("q", 8), "float64": ("d", 8),
    "uuid": ("16s", 16),
}
_WIDTH_BITS = {"int16": 16, "int32": 32, "int64": 64}

# ---------------------------------------------------------------------------
# runtime helpers used by generated code


def _derr(reason: str, expected: str | None = None) -> DecodeError:
    return DecodeError(reason, expected=expected)


def read_uvarint(buf: bytes, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """Read an unsigned varint (KIP-482) at ``pos``; return ``(value, new_pos)``.

    Raises:
        DecodeError: truncated, or longer than ``max_bytes`` (5 for 32-bit, 10 for
            64-bit values).
    """
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
    write_uvarint(out, ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1))


def _wup(out: bytearray, n: int, bits: int) -> None:
    if n < 0:
        raise EncodeError(f"negative value {n} cannot be written as an unsigned varint")
    write_uvarint(out, n)


def _check_int(v: Any, t: str) -> None:
    lo, hi = INT_RANGES[t]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise EncodeError(f"{v!r} is not a valid {t}")


_arr_cache: dict[tuple[str, int], Callable] = {}


def _ua(code: str, n: int, buf: bytes, pos: int) -> list:
    key = (code, n)
    f = _arr_cache.get(key)
    if f is None:
        f = _struct.Struct(">%d%s" % (n, code)).unpack_from
        if len(_arr_cache) < 4096:
            _arr_cache[key] = f
    return list(f(buf, pos))


def _pa(code: str, v: list) -> bytes:
    return _struct.pack(">%d%s" % (len(v), code), *v)


_PACK_CACHE: dict[str, Callable] = {}


def _packer(fmt: str) -> Callable:
    p = _PACK_CACHE.get(fmt)
    if p is None:
        p = _PACK_CACHE[fmt] = _struct.Struct(fmt).pack
    return p


class _Marker:
    """A tag present on the wire whose value equals the field default."""


def _mark_present(o: Struct, tag: int) -> None:
    p = getattr(o, "_present", None)
    o._present = (p or frozenset()) | {tag}


BASE_NS: dict[str, Any] = {
    "_new": object.__new__, "_uv": read_uvarint, "_uvl": _uvl, "_zz32": _zz32,
    "_zz64": _zz64, "_wuv": write_uvarint, "_wzz": _wzz, "_wup": _wup, "_ua": _ua,
    "_pa": _pa, "_DE": _derr, "_EE": EncodeError, "_ci": _check_int,
    "_mark": _mark_present, "_str": str, "_len": len, "_bytes": bytes, "_list": list,
    "_isinst": isinstance, "_Struct": Struct, "_range": range,
    "_ph": _struct.Struct(">h").pack, "_pi": _struct.Struct(">i").pack,
    "_uh": _struct.Struct(">h").unpack_from, "_ui": _struct.Struct(">i").unpack_from,
    "_ub": _struct.Struct(">b").unpack_from, "_getp": getattr,
}


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
        name = f"C_{st.name}_{id(st)}"
        self.ns[name] = st.cls
        return name

    def fn(self, kind: str, st: StructSpec) -> str:
        return f"{kind}_{st.name}_{id(st)}"

    def compact(self, f: FieldSpec) -> bool:
        if f.flexible_versions is not None:
            return f.flexible_versions.contains(self.version)
        return self.flexible

    def present(self, f: FieldSpec) -> bool:
        return f.versions.contains(self.version)

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
        v = self.version
        cls = self.cls_name(st)
        self.emit(0, f"def {self.fn('d', st)}(buf, pos, end{self.targ()}):")
        self.emit(1, f"o = _new({cls})")
        fields = st.fields
        tagged = [f for f in fields if f.tagged_in(v)]
        i = 0
        while i < len(fields):
            f = fields[i]
            if not self.present(f) or f.tagged_in(v):
                self.emit(1, f"o.{f.name} = {self.default_expr(f)}")
                i += 1
                continue
            if not self.traced and self.is_fixed(f):
                run = [f]
                j = i + 1
                while j < len(fields) and self.present(fields[j]) and not fields[j].tagged_in(v) \
                        and self.is_fixed(fields[j]):
                    run.append(fields[j])
                    j += 1
                if len(run) > 1:
                    fmt = ">" + "".join(FIXED[x.type][0] for x in run)
                    size = sum(FIXED[x.type][1] for x in run)
                    u = self._c(_struct.Struct(fmt).unpack_from)
                    targets = ", ".join(f"o.{x.name}" for x in run)
                    self.emit(1, f"{targets} = {u}(buf, pos)")
                    self.emit(1, f"pos += {size}")
                    i = j
                    continue
            self.read_field(1, f, f"o.{f.name}")
            i += 1
        if self.flexible:
            self.read_uv(1, "n")
            self.emit(1, "if n:")
            if self.traced:
                self.emit(2, f"T.append(('<tagged fields>', pos, 'tag section'))")
            self.emit(2, f"pos = {self.fn('t', st)}(o, buf, pos, end, n{self.targ()})")
            if self.traced:
                self.emit(2, "T.pop()")
            self.emit(1, "else:")
            self.emit(2, "o._unknown = None")
        else:
            self.emit(1, "o._unknown = None")
        self.emit(1, "return o, pos")
        self.emit(0, "")
        if self.flexible:
            self.gen_tags(st, tagged)

    def gen_tags(self, st: StructSpec, tagged: list[FieldSpec]) -> None:
        self.emit(0, f"def {self.fn('t', st)}(o, buf, pos, end, cnt{self.targ()}):")
        self.emit(1, "u = None")
        self.emit(1, "last = -1")
        self.emit(1, "for _ in _range(cnt):")
        self.read_uv(2, "t")
        self.read_uv(2, "sz")
        self.emit(2, "if t <= last:")
        self.emit(3, "raise _DE('tagged fields out of order: tag %d after tag %d' % (t, last), "
                     "'ascending tags')")
        self.emit(2, "last = t")
        self.emit(2, "e = pos + sz")
        self.emit(2, "if e > end:")
        self.emit(3, "raise _DE('tagged field %d claims %d bytes, %d left' % (t, sz, end - pos), "
                     "'tagged field data')")
        kw = "if"
        for f in sorted(tagged, key=lambda x: x.tag):
            self.emit(2, f"{kw} t == {f.tag}:")
            kw = "elif"
            if self.traced:
                self.emit(3, f"T.append(({f.name!r}, pos, {self.describe(f)!r}))")
            self.emit(3, "end0 = end")
            self.emit(3, "end = e")
            self.read_field(3, f, f"o.{f.name}", in_tag=True)
            self.emit(3, "end = end0")
            self.emit(3, "if pos != e:")
            self.emit(4, f"raise _DE('tagged field {f.name} (tag {f.tag}) declared %d bytes but "
                         f"its value took %d' % (sz, pos - e + sz), 'tagged field of size')")
            self.emit(3, f"if o.{f.name} == {self.default_cmp(f)}:")
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
            return f"{self.cls_name(f.struct)}()"
        return self.const(f.default)

    def default_cmp(self, f: FieldSpec) -> str:
        """An expression equal to the field's default, for comparisons."""
        if f.is_array:
            return "None" if f.default_text == "null" else "[]"
        if f.struct is not None:
            if f.default_text == "null":
                return "None"
            return self._c(struct_class(f.struct)())
        return self.const(f.default)

    def read_uv(self, ind: int, var: str) -> None:
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, f"if {var} < 128:")
        self.emit(ind + 1, "pos += 1")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"{var}, pos = _uv(buf, pos)")

    def read_field(self, ind: int, f: FieldSpec, target: str, in_tag: bool = False) -> None:
        v = self.version
        if self.traced and not in_tag:
            self.emit(ind, f"T.append(({f.name!r}, pos, {self.describe(f)!r}))")
        compact = True if in_tag else self.compact(f)
        nullable = f.nullable_in(v)
        if f.is_array:
            n = self.tmp("n")
            if compact:
                self.read_uv(ind, n)
                self.emit(ind, f"{n} -= 1")
            else:
                self.emit(ind, f"{n}, = _ui(buf, pos)")
                self.emit(ind, "pos += 4")
            self.emit(ind, f"if {n} < 0:")
            if nullable:
                self.emit(ind + 1, f"if {n} != -1:")
                self.emit(ind + 2, f"raise _DE('invalid array length %d' % {n}, 'array length')")
                self.emit(ind + 1, f"{target} = None")
            else:
                self.emit(ind + 1, f"raise _DE('null or negative length %d for a non-nullable "
                                   f"array' % {n}, 'array length >= 0')")
            self.emit(ind, f"elif {n} > end - pos:")
            self.emit(ind + 1, f"raise _DE('array length %d exceeds the %d bytes left' % "
                               f"({n}, end - pos), 'array length')")
            self.emit(ind, "else:")
            et = f.element_type
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
                    self.emit(ind + 1, f"{ap} = {a}.append")
                    self.emit(ind + 1, f"for _ in _range({n}):")
                    self.emit(ind + 2, f"x, pos = {sub}(buf, pos, end)")
                    self.emit(ind + 2, f"{ap}(x)")
                self.emit(ind + 1, f"{target} = {a}")
            elif et in FIXED and et != "uuid":
                code, size = FIXED[et]
                self.emit(ind + 1, f"if {n} * {size} > end - pos:")
                self.emit(ind + 2, f"raise _DE('array of %d {et} exceeds the %d bytes left' % "
                                   f"({n}, end - pos), 'array of {et}')")
                self.emit(ind + 1, f"{target} = _ua({code!r}, {n}, buf, pos)")
                self.emit(ind + 1, f"pos += {n} * {size}")
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
                if in_tag:
                    m = self.tmp("m")
                    self.read_uv(ind, m)
                    self.emit(ind, f"if {m} == 0:")
                    self.emit(ind + 1, f"{target} = None")
                    self.emit(ind, f"elif {m} != 1:")
                    self.emit(ind + 1, f"raise _DE('invalid nullable struct marker %d' % {m}, "
                                       f"'0 (null) or 1 (present)')")
                else:
                    m = self.tmp("m")
                    self.emit(ind, f"{m}, = _ub(buf, pos)")
                    self.emit(ind, "pos += 1")
                    self.emit(ind, f"if {m} == -1:")
                    self.emit(ind + 1, f"{target} = None")
                    self.emit(ind, f"elif {m} != 1:")
                    self.emit(ind + 1, f"raise _DE('invalid nullable struct marker %d' % {m}, "
                                       f"'-1 (null) or 1 (present)')")
                self.emit(ind, "else:")
                self.emit(ind + 1, f"{target}, pos = {sub}(buf, pos, end{self.targ()})")
            else:
                self.emit(ind, f"{target}, pos = {sub}(buf, pos, end{self.targ()})")
        else:
            self.read_prim(ind, f.type, target, compact, nullable, f)
        if self.traced and not in_tag:
            self.emit(ind, "T.pop()")

    def read_prim(self, ind: int, t: str, target: str, compact: bool, nullable: bool,
                  f: FieldSpec, element: bool = False) -> None:
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
        if compact:
            self.read_uv(ind, n)
            self.emit(ind, f"{n} -= 1")
        elif t == "string":
            self.emit(ind, f"{n}, = _uh(buf, pos)")
            self.emit(ind, "pos += 2")
        else:
            self.emit(ind, f"{n}, = _ui(buf, pos)")
            self.emit(ind, "pos += 4")
        kind = ("compact " if compact else "") + t
        self.emit(ind, f"if {n} < 0:")
        if nullable:
            self.emit(ind + 1, f"if {n} != -1:")
            self.emit(ind + 2, f"raise _DE('invalid length %d' % {n}, '{kind} length')")
            self.emit(ind + 1, f"{target} = None")
        else:
            self.emit(ind + 1, f"raise _DE('null or negative length %d for a non-nullable {t}' "
                               f"% {n}, 'non-null {kind}')")
        self.emit(ind, "else:")
        e = self.tmp("e")
        self.emit(ind + 1, f"{e} = pos + {n}")
        self.emit(ind + 1, f"if {e} > end:")
        self.emit(ind + 2, f"raise _DE('{t} length %d exceeds the %d bytes left' % "
                           f"({n}, end - pos), '{kind} data')")
        if t == "string":
            self.emit(ind + 1, f"{target} = _str(buf[pos:{e}], 'utf-8')")
        else:
            self.emit(ind + 1, f"{target} = buf[pos:{e}]")
        self.emit(ind + 1, f"pos = {e}")

    # -- encode -------------------------------------------------------------------
    def gen_encode(self, st: StructSpec) -> None:
        v = self.version
        self.emit(0, f"def {self.fn('e', st)}(o, out{self.targ()}):")
        fields = st.fields
        i = 0
        wrote = False
        while i < len(fields):
            f = fields[i]
            if not self.present(f):
                self.check_absent(1, f)
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
                fmt = ">" + "".join(FIXED[x.type][0] for x in run)
                p = self._c(_struct.Struct(fmt).pack)
                args = ", ".join(f"o.{x.name}" for x in run)
                self.emit(1, f"out += {p}({args})")
                wrote = True
                i = j
                continue
            self.write_field(1, f, f"o.{f.name}")
            wrote = True
            i += 1
        if self.flexible:
            self.write_tags(1, st)
            wrote = True
        if not wrote:
            self.emit(1, "pass")
        self.emit(0, "")

    def check_absent(self, ind: int, f: FieldSpec) -> None:
        if f.ignorable:
            return
        val = f"o.{f.name}"
        if f.is_array:
            cond = f"{val}"
        elif f.struct is not None:
            cond = f"{val} is not None" if f.default_text == "null" else \
                f"{val} != {self.default_cmp(f)}"
        else:
            cond = f"{val} != {self.default_cmp(f)}"
        self.emit(ind, f"if {cond}:")
        self.emit(ind + 1, f"raise _EE('non-default value %r for field {f.name}, which version "
                           f"{self.version} does not have and which is not ignorable' % ({val},), "
                           f"{f.name!r})")

    def write_tags(self, ind: int, st: StructSpec) -> None:
        v = self.version
        tagged = sorted((f for f in st.fields if f.tagged_in(v)), key=lambda x: x.tag)
        if not tagged:
            self.emit(ind, "u = o._unknown")
            self.emit(ind, "if u:")
            self.emit(ind + 1, "_wtags(out, sorted(u.items()))")
            self.emit(ind, "else:")
            self.emit(ind + 1, "out.append(0)")
            self.ns["_wtags"] = _write_tags
            return
        self.ns["_wtags"] = _write_tags
        self.emit(ind, "tg = []")
        self.emit(ind, "pr = _getp(o, '_present', None)")
        for f in tagged:
            val = f"o.{f.name}"
            if f.is_array and f.default_text != "null":
                cond = f"{val} is None or {val}"
            else:
                cond = f"{val} != {self.default_cmp(f)}"
            self.emit(ind, f"if {cond} or (pr and {f.tag} in pr):")
            if self.traced:
                self.emit(ind + 1, f"T.append(({f.name!r}, len(out), {self.describe(f)!r}))")
            self.emit(ind + 1, "b = out")
            self.emit(ind + 1, "out = bytearray()")
            self.write_field(ind + 1, f, val, in_tag=True)
            self.emit(ind + 1, f"tg.append(({f.tag}, out))")
            self.emit(ind + 1, "out = b")
            if self.traced:
                self.emit(ind + 1, "T.pop()")
        self.emit(ind, "u = o._unknown")
        self.emit(ind, "if u:")
        self.emit(ind + 1, "tg.extend(u.items())")
        self.emit(ind + 1, "tg.sort(key=_k0)")
        self.ns["_k0"] = _tag_key
        self.emit(ind, "if tg:")
        self.emit(ind + 1, "_wtags(out, tg)")
        self.emit(ind, "else:")
        self.emit(ind + 1, "out.append(0)")

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
            if compact:
                self.write_uv(ind + 1, f"len({x}) + 1")
            else:
                self.emit(ind + 1, f"out += _pi(len({x}))")
            et = f.element_type
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
                    self.emit(ind + 1, f"for y in {x}:")
                    self.emit(ind + 2, f"{sub}(y, out)")
            elif et in FIXED and et != "uuid":
                code = FIXED[et][0]
                if self.traced and et in INT_RANGES:
                    self.emit(ind + 1, f"for y in {x}:")
                    self.emit(ind + 2, f"_ci(y, {et!r})")
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
            self.emit(ind2, f"{sub}({x}, out{self.targ()})")
        else:
            self.write_prim(ind, f.type, x, compact, nullable, f)
        if self.traced and not in_tag:
            self.emit(ind, "T.pop()")

    def write_prim(self, ind: int, t: str, x: str, compact: bool, nullable: bool,
                   f: FieldSpec, element: bool = False) -> None:
        if t in FIXED:
            enc = "fixed" if element or t not in _WIDTH_BITS else f.encoding_in(self.version)
            if self.traced and t in INT_RANGES:
                self.emit(ind, f"_ci({x}, {t!r})")
            if enc == "packed":
                self.emit(ind, f"_wzz(out, {x}, {_WIDTH_BITS[t]})")
            elif enc == "upacked":
                self.emit(ind, f"_wup(out, {x}, {_WIDTH_BITS[t]})")
            elif t == "uuid":
                self.emit(ind, f"if len({x}) != 16:")
                self.emit(ind + 1, f"raise _EE('uuid must be 16 bytes, got %d' % len({x}))")
                self.emit(ind, f"out += {x}")
            else:
                p = self._c(_struct.Struct(">" + FIXED[t][0]).pack)
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
            self.emit(ind + 1, f"{b} = {x}.encode()")
        else:
            if self.traced:
                self.emit(ind + 1, f"if not _isinst({x}, (bytes, bytearray, memoryview)):")
                self.emit(ind + 2, f"raise _EE('expected bytes, got %s' % type({x}).__name__)")
            self.emit(ind + 1, f"{b} = {x}")
        if compact:
            self.write_uv(ind + 1, f"len({b}) + 1")
        elif t == "string":
            if self.traced:
                self.emit(ind + 1, f"if len({b}) > 32767:")
                self.emit(ind + 2, "raise _EE('string longer than 32767 bytes')")
            self.emit(ind + 1, f"out += _ph(len({b}))")
        else:
            self.emit(ind + 1, f"out += _pi(len({b}))")
        self.emit(ind + 1, f"out += {b}")


def _tag_key(item: tuple[int, Any]) -> int:
    return item[0]


def _write_tags(out: bytearray, tags: list[tuple[int, bytes]]) -> None:
    write_uvarint(out, len(tags))
    last = -1
    for tag, data in tags:
        if tag <= last:
            raise EncodeError(f"duplicate tag {tag}")
        last = tag
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data


class CompiledVersion:
    """The decode and encode functions of one message at one version."""

    __slots__ = ("decode", "encode", "decode_traced", "encode_traced", "source")

    def __init__(self, msg: MessageSpec, version: int):
        self.decode, self.encode, self.source = _compile(msg, version, traced=False)
        self.decode_traced = None
        self.encode_traced = None

    def traced(self, msg: MessageSpec, version: int) -> None:
        if self.decode_traced is None:
            self.decode_traced, self.encode_traced, _ = _compile(msg, version, traced=True)


def _compile(msg: MessageSpec, version: int, traced: bool):
    unit = _Unit(msg, version, traced)
    unit.gen_struct(msg.struct)
    source = "\n".join(unit.lines)
    code = compile(source, f"<kinspect {msg.name} v{version}{' traced' if traced else ''}>", "exec")
    exec(code, unit.ns)
    return unit.ns[unit.fn("d", msg.struct)], unit.ns[unit.fn("e", msg.struct)], source
