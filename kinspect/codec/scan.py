"""Walk a message without building it: where it ends and which top-level tagged
fields it carries.

For the forwarding path, where a full decode costs too much: the proxy holds
Produce (v10+) and Fetch (v16+) responses only because they *may* carry the
KIP-951 ``NodeEndpoints`` tagged field, which it must rewrite; a scan tells
whether the tag is there without creating one Python object per struct.

The scanner of one (message, version) is generated and compiled once, like the
decoders (:mod:`kinspect.codec.compiler`): fixed-width runs become one addition,
lengths and counts are read inline, and array elements are walked in a loop with
their struct inlined. It validates what it walks (lengths within the bytes left,
counts bounded by the bytes left before looping, varints of bounded length, the
message ending exactly at ``end``) and allocates nothing proportional to the
input but the list of top-level tag numbers. It checks less than a decode (string
contents are not UTF-8-checked, tagged fields' data not read): a frame it accepts
may still fail to decode, never the reverse. Nulls are read as the decoder reads
them (any negative length of a nullable field; a nullable struct's marker).
"""

from __future__ import annotations

from typing import Any, Callable

from .compiler import FIXED, _derr, read_compact_prefix, read_uvarint
from .spec import FieldSpec, MessageSpec, StructSpec

_NS: dict[str, Any] = {"_uv": read_uvarint, "_uvc": read_compact_prefix, "_DE": _derr,
                       "_range": range}


class _ScanGen:
    def __init__(self, msg: MessageSpec, version: int):
        self.version = version
        self.flexible = msg.is_flexible(version)
        self.lines: list[str] = []
        self.ntmp = 0
        self.ns = dict(_NS)

    def tmp(self, p: str) -> str:
        self.ntmp += 1
        return f"{p}{self.ntmp}"

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def compact(self, f: FieldSpec) -> bool:
        if f.flexible_versions is not None:
            return f.flexible_versions.contains(self.version)
        return self.flexible

    def fixed_size(self, f: FieldSpec) -> int | None:
        if f.is_array or f.type not in FIXED:
            return None
        if f.type in ("int16", "int32", "int64") and f.encoding_in(self.version) != "fixed":
            return None
        return FIXED[f.type][1]

    def uv(self, ind: int, var: str, length: bool = False) -> None:
        """A uvarint into ``var`` (``length``: a compact length prefix, read as Java
        reads it, see :func:`~kinspect.codec.compiler.read_compact_prefix`)."""
        self.emit(ind, f"{var} = buf[pos]")
        self.emit(ind, f"if {var} < 128:")
        self.emit(ind + 1, "pos += 1")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"{var}, pos = {'_uvc' if length else '_uv'}(buf, pos)")

    def length(self, ind: int, n: str, compact: bool, wide: bool) -> None:
        """Put a length or count into ``n`` (-1 = null)."""
        if compact:
            self.uv(ind, n, length=True)
            self.emit(ind, f"{n} -= 1")
        else:
            u = f"_u{'i' if wide else 'h'}"
            if u not in self.ns:
                import struct

                self.ns[u] = struct.Struct(">i" if wide else ">h").unpack_from
            self.emit(ind, f"{n}, = {u}(buf, pos)")
            self.emit(ind, f"pos += {4 if wide else 2}")

    def struct(self, st: StructSpec, ind: int, top: bool = False) -> None:
        """Code advancing ``pos`` over one ``st``."""
        v = self.version
        run = 0
        for f in st.fields:
            if not f.versions.contains(v) or f.tagged_in(v):
                continue
            size = self.fixed_size(f)
            if size is not None:
                run += size
                continue
            if run:
                self.emit(ind, f"pos += {run}")
                run = 0
            self.field(f, ind)
        if run:
            self.emit(ind, f"pos += {run}")
        if self.flexible:
            self.tags(ind, top, sorted(f.tag for f in st.fields
                                       if f.is_tagged and not f.tagged_in(v)))

    def field(self, f: FieldSpec, ind: int, in_tag: bool = False) -> None:
        v = self.version
        compact = True if in_tag else self.compact(f)
        nullable = f.nullable_in(v)
        if f.is_array:
            n = self.tmp("n")
            self.length(ind, n, compact, wide=True)
            self.emit(ind, f"if {n} < 0:")
            self.emit(ind + 1, "pass" if nullable else
                      f"raise _DE('negative length %d for a non-nullable array' % {n}, "
                      f"'array length')")
            et = f.element_type
            if f.struct is None and et in FIXED:
                size = FIXED[et][1]
                self.emit(ind, "else:")
                self.emit(ind + 1, f"pos += {n} * {size}" if size > 1 else f"pos += {n}")
                self.emit(ind + 1, "if pos > end:")
                self.emit(ind + 2, "raise _DE('array past the end', 'array')")
                return
            # every element takes at least one byte: the count is bounded first
            self.emit(ind, f"elif {n} > end - pos:")
            self.emit(ind + 1, f"raise _DE('array length %d exceeds the bytes left' % {n}, "
                               f"'array length')")
            self.emit(ind, "else:")
            self.emit(ind + 1, f"for _ in _range({n}):")
            mark = len(self.lines)
            if f.struct is not None:
                self.struct(f.struct, ind + 2)
            else:
                self.prim(et, ind + 2, compact, False, f)
            if len(self.lines) == mark:  # elements with no bytes in this version
                self.emit(ind + 2, "pass")
            return
        if f.struct is not None:
            if nullable:
                m = self.tmp("m")
                # present unless the marker means null (as the decoder reads it)
                if in_tag:
                    self.uv(ind, m)
                    self.emit(ind, f"if 0 < {m} < 2147483648:")
                else:
                    self.emit(ind, f"{m} = buf[pos]")
                    self.emit(ind, "pos += 1")
                    self.emit(ind, f"if {m} < 128:")
                mark = len(self.lines)
                self.struct(f.struct, ind + 1)
                if len(self.lines) == mark:
                    self.emit(ind + 1, "pass")
            else:
                self.struct(f.struct, ind)
            return
        self.prim(f.type, ind, compact, nullable, f)

    def prim(self, t: str, ind: int, compact: bool, nullable: bool, f: FieldSpec) -> None:
        if t in FIXED:
            enc = "fixed" if f.is_array or t not in ("int16", "int32", "int64") \
                else f.encoding_in(self.version)
            if enc == "fixed":
                self.emit(ind, f"pos += {FIXED[t][1]}")
            else:  # a varint of at most 10 bytes
                x = self.tmp("x")
                self.emit(ind, f"{x}, pos = _uv(buf, pos, 10)")
            return
        n = self.tmp("n")
        self.length(ind, n, compact, wide=t != "string")
        if t == "string" and compact:
            self.emit(ind, f"if {n} > 32767:")
            self.emit(ind + 1, f"raise _DE('string length %d is longer than 32767' % {n}, "
                               f"'string length')")
        self.emit(ind, f"if {n} > 0:")
        self.emit(ind + 1, f"pos += {n}")
        if not nullable:
            self.emit(ind, f"elif {n} < 0:")
            self.emit(ind + 1, f"raise _DE('negative length %d for a non-nullable {t}' % {n}, "
                               f"'{t} length')")

    def tags(self, ind: int, top: bool, invalid: list[int]) -> None:
        """A tag section, rejected where the decoder rejects it: a tag repeated in it,
        or a tag of a field of the struct that is not tagged at this version
        (``invalid``). Order is free."""
        c = self.tmp("c")
        self.uv(ind, c)
        self.emit(ind, f"if {c} > end - pos:")
        self.emit(ind + 1, f"raise _DE('%d tagged fields in the %d bytes left' % ({c}, end - pos), "
                           f"'tag section')")
        self.emit(ind, f"if {c}:")
        t, s, seen = self.tmp("t"), self.tmp("s"), self.tmp("seen")
        self.emit(ind + 1, f"{seen} = set()")
        self.emit(ind + 1, f"for _ in _range({c}):")
        self.uv(ind + 2, t)
        self.uv(ind + 2, s)
        self.emit(ind + 2, f"pos += {s}")
        self.emit(ind + 2, f"if {t} in {seen}:")
        self.emit(ind + 3, f"raise _DE('tag %d repeated in one tag section' % {t}, "
                           f"'each tag once')")
        self.emit(ind + 2, f"{seen}.add({t})")
        if invalid:
            self.emit(ind + 2, f"if {t} in {frozenset(invalid)!r}:")
            self.emit(ind + 3, f"raise _DE('tag %d is not valid for version {self.version}' % {t}, "
                               f"'a valid tag')")
        if top:
            self.emit(ind + 2, f"tags.append({t})")


def compile_scanner(msg: MessageSpec, version: int) -> Callable[[bytes, int, int], tuple]:
    """The scanner of ``msg`` at ``version``: ``scan(buf, pos, end) -> (pos after the
    message, [top-level tags present])``. It raises ``DecodeError``, ``IndexError``
    or ``struct.error`` on malformed input (callers turn those into a precise
    :class:`~kinspect.codec.errors.DecodeError`, see ``MessageCodec.top_level_tags``)."""
    g = _ScanGen(msg, version)
    g.emit(0, "def scan(buf, pos, end):")
    g.emit(1, "tags = []")
    g.struct(msg.struct, 1, top=True)
    g.emit(1, "return pos, tags")
    source = "\n".join(g.lines) + "\n"
    exec(compile(source, f"<kinspect {msg.name} v{version} scan>", "exec"), g.ns)
    return g.ns["scan"]
