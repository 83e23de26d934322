"""Hypothesis strategies that build random valid values for any message spec version."""

from __future__ import annotations

from hypothesis import strategies as st

from kinspect.codec.spec import INT_RANGES, FieldSpec, MessageSpec, StructSpec
from kinspect.codec.values import struct_class

_MAX_LIST = 3


def _prim(t: str, nullable: bool, enc: str = "fixed") -> st.SearchStrategy:
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        if enc == "upacked":
            lo = 0
        s = st.integers(lo, hi)
    elif t == "bool":
        s = st.booleans()
    elif t == "float64":
        s = st.floats(allow_nan=False)
    elif t == "string":
        s = st.text(max_size=8)
    elif t == "uuid":
        s = st.binary(min_size=16, max_size=16)
    elif t in ("bytes", "records"):
        s = st.binary(max_size=12)
    else:  # pragma: no cover - spec validation rejects other types
        raise AssertionError(t)
    return st.one_of(st.none(), s) if nullable else s


def unknown_tags(known: set[int]) -> st.SearchStrategy:
    tag = st.integers(0, 2**31 - 1).filter(lambda t: t not in known)
    return st.dictionaries(tag, st.binary(max_size=6), max_size=2)


def struct_values(spec: StructSpec, version: int, flexible: bool,
                  depth: int = 0) -> st.SearchStrategy:
    """Random instances of ``spec`` holding only what ``version`` can carry."""
    cls = struct_class(spec)
    fields: dict[str, st.SearchStrategy] = {}
    for f in spec.fields:
        if not f.versions.contains(version):
            continue
        fields[f.name] = field_values(f, version, flexible, depth)
    known = {f.tag for f in spec.fields if f.tag is not None}
    tags = unknown_tags(known) if flexible else st.just({})

    @st.composite
    def build(draw):
        obj = cls()
        for name, s in fields.items():
            setattr(obj, name, draw(s))
        obj.unknown_tags = draw(tags)
        return obj

    return build()


def field_values(f: FieldSpec, version: int, flexible: bool, depth: int) -> st.SearchStrategy:
    nullable = f.nullable_in(version)
    if f.struct is not None:
        inner = struct_values(f.struct, version, flexible, depth + 1)
        if f.is_array:
            s = st.lists(inner, max_size=_MAX_LIST if depth < 2 else 1)
        else:
            s = inner
        return st.one_of(st.none(), s) if nullable else s
    if f.is_array:
        s = st.lists(_prim(f.element_type, False), max_size=_MAX_LIST)
        return st.one_of(st.none(), s) if nullable else s
    return _prim(f.type, nullable, f.encoding_in(version))


def message_values(spec: MessageSpec, version: int) -> st.SearchStrategy:
    return struct_values(spec.struct, version, spec.is_flexible(version))
