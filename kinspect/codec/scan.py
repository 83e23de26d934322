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

from .codecache import compile_cached
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

    def function(self, msg: MessageSpec, name: str, lists: list[str], result: str) -> Callable:
        """Compile ``name(buf, pos, end)``: the lines emitted so far (its first
        statements), the walk of ``msg`` and ``return result``; ``lists`` start
        empty."""
        head = ["def %s(buf, pos, end):" % name] + [f"    {v} = []" for v in lists]
        self.lines[:0] = head
        self.struct(msg.struct, 1, top=True)
        self.emit(1, f"return {result}")
        source = "\n".join(self.lines) + "\n"
        exec(compile_cached(source, f"<kinspect {msg.name} v{self.version} {name}>"), self.ns)
        return self.ns[name]

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
            if size is not None and not self.wants(f):
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

    def wants(self, f: FieldSpec) -> bool:
        """Whether ``f`` must be walked on its own, not added to a run of fixed-width
        fields (the locator's fields; none for the scanner)."""
        return False

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
            if len(self.lines) == mark:
                # elements that take no bytes at this version: nothing to walk (a
                # loop over them would take time for bytes that are not there)
                self.lines[mark - 1] = "    " * (ind + 1) + "pass"
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
        self.tag_data(ind + 2, t, s)
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

    def tag_data(self, ind: int, t: str, s: str) -> None:
        """Code reading a tagged field's size into ``s`` and advancing over its data
        (its tag is in ``t``)."""
        self.uv(ind, s)
        self.emit(ind, f"pos += {s}")


def compile_scanner(msg: MessageSpec, version: int) -> Callable[[bytes, int, int], tuple]:
    """The scanner of ``msg`` at ``version``: ``scan(buf, pos, end) -> (pos after the
    message, [top-level tags present])``. It raises ``DecodeError``, ``IndexError``
    or ``struct.error`` on malformed input (callers turn those into a precise
    :class:`~kinspect.codec.errors.DecodeError`, see ``MessageCodec.top_level_tags``)."""
    return _ScanGen(msg, version).function(msg, "scan", ["tags"], "pos, tags")


class Located:
    """What :func:`compile_locator` returns: ``locate(buf, pos, end) -> (pos after the
    message, spans, sizes)`` and, per path, whether its field was read as a compact
    (KIP-482) field.

    ``spans``: ``(group, path index, start, end)`` for every occurrence of a path's
    last field, in wire order; ``start``/``end`` are offsets into ``buf`` of the
    field's whole encoding (a string's length prefix included; a tagged field's
    data, without its tag and size). ``group`` numbers the structs holding such
    fields, so that fields of one struct share it (a struct walked between two of
    its fields has a number of its own). ``sizes``: ``(size start, data
    start, data end)`` of every tagged field walked into on the way (KIP-482: its
    size is an unsigned varint before its data), in the order their data ends
    (a tagged field inside another before it)."""

    __slots__ = ("locate", "compact")

    def __init__(self, locate: Callable[[bytes, int, int], tuple], compact: list[bool]):
        self.locate = locate
        self.compact = compact


class _LocateGen(_ScanGen):
    """The scanner's walk, recording where the fields at the end of ``paths`` lie."""

    def __init__(self, msg: MessageSpec, version: int, paths: list[tuple[FieldSpec, ...]]):
        super().__init__(msg, version)
        #: the paths (with their indexes) into the next struct walked
        self.pending: list[tuple[tuple[FieldSpec, ...], int]] = \
            [(p, i) for i, p in enumerate(paths)]
        #: per field (by id) of the struct being walked: (the field, the paths below
        #: it, the index of the path ending at it or None)
        self.ctx: dict[int, tuple[FieldSpec, list, int | None]] = {}
        self.compact_of = [False] * len(paths)
        #: the variable holding the number of the struct whose fields are recorded
        self.group = "g"

    def struct(self, st: StructSpec, ind: int, top: bool = False) -> None:
        paths, self.pending = self.pending, []
        ctx: dict[int, tuple[FieldSpec, list, int | None]] = {}
        for path, i in paths:
            f = path[0]
            _, tails, target = ctx.get(id(f), (f, [], None))
            if len(path) == 1:
                target = i
            else:
                tails = tails + [(path[1:], i)]
            ctx[id(f)] = (f, tails, target)
        outer_group = self.group
        if any(target is not None for _, _, target in ctx.values()):
            # this struct's own number: structs walked inside it take later ones
            self.group = self.tmp("gid")
            self.emit(ind, "g += 1")
            self.emit(ind, f"{self.group} = g")
        outer, self.ctx = self.ctx, ctx
        try:
            super().struct(st, ind, top)
        finally:
            self.ctx = outer
            self.group = outer_group

    def wants(self, f: FieldSpec) -> bool:
        return id(f) in self.ctx

    def field(self, f: FieldSpec, ind: int, in_tag: bool = False) -> None:
        entry = self.ctx.get(id(f))
        if entry is None:
            super().field(f, ind, in_tag)
            return
        _, tails, target = entry
        a = self.tmp("a")
        if target is not None:
            self.emit(ind, f"{a} = pos")
            self.compact_of[target] = True if in_tag else self.compact(f)
        self.pending = tails
        super().field(f, ind, in_tag)
        self.pending = []
        if target is not None:
            self.emit(ind, f"spans.append(({self.group}, {target}, {a}, pos))")

    def tag_data(self, ind: int, t: str, s: str) -> None:
        v = self.version
        wanted = [e for e in self.ctx.values() if e[0].tagged_in(v)]
        if not wanted:
            super().tag_data(ind, t, s)
            return
        z, q = self.tmp("z"), self.tmp("q")
        self.emit(ind, f"{z} = pos")
        self.uv(ind, s)
        self.emit(ind, f"{q} = pos")
        for k, (f, tails, target) in enumerate(wanted):
            self.emit(ind, f"{'if' if k == 0 else 'elif'} {t} == {f.tag}:")
            if target is not None:  # the field itself: its data
                self.compact_of[target] = True
                self.emit(ind + 1, f"spans.append(({self.group}, {target}, {q}, {q} + {s}))")
                self.emit(ind + 1, f"pos += {s}")
            else:
                self.pending = tails
                _ScanGen.field(self, f, ind + 1, in_tag=True)
                self.pending = []
                self.emit(ind + 1, f"if pos != {q} + {s}:")
                self.emit(ind + 2, f"raise _DE('tagged field %d is %d bytes, its data %d' "
                                   f"% ({t}, {s}, pos - {q}), 'data of the tagged field\\'s size')")
            self.emit(ind + 1, f"sizes.append(({z}, {q}, {q} + {s}))")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"pos += {s}")


def compile_locator(msg: MessageSpec, version: int,
                    paths: list[tuple[FieldSpec, ...]]) -> Located:
    """Where, on the wire, the fields at the end of ``paths`` lie in a message of
    ``msg`` at ``version`` (see :class:`Located`): the scanner's walk (same checks),
    which also enters the structs and tagged fields on the paths. A path is a
    sequence of fields from the top level, each a field of the struct of the one
    before; every field on it must exist at ``version``. For splicing a value into
    a frame without re-encoding the rest of it (the proxy's address rewriting).

    The ``locate`` function raises ``DecodeError``, ``IndexError`` or
    ``struct.error`` on malformed input; callers check that it ends at ``end``."""
    g = _LocateGen(msg, version, paths)
    g.emit(1, "g = 0")
    return Located(g.function(msg, "locate", ["tags", "spans", "sizes"], "pos, spans, sizes"),
                   g.compact_of)
