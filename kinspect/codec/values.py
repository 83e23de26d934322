"""Decoded values: one Python class per spec struct.

Instances expose the spec's field names as attributes and keys (``topic.Name``,
``topic["Name"]``), compare by value, print readably, and convert to and from
plain JSON-able dicts. Unknown tagged fields (KIP-482) a decoder met are kept,
in wire order, in :attr:`Struct.unknown_tags` as ``{tag: bytes}``.
"""

from __future__ import annotations

import base64
import keyword
from typing import Any, Iterator

from .errors import EncodeError
from .spec import FieldSpec, StructSpec, uuid_from_text, uuid_to_text

_UNSET = object()


class Struct:
    """Base class of every decoded struct and message.

    Subclasses are generated from a :class:`~kinspect.codec.spec.StructSpec`
    (see :func:`struct_class`); their ``__slots__`` are the spec's field names. A
    field named like a method here (``copy``, ``get``, ``items``, ``keys``,
    ``defaults``) hides that method on its instances, as the spec asks: call it
    through this class then (``Struct.copy(o)``). A field named like a Python
    keyword is also reachable as ``o.<name>_`` (:func:`attribute_alias`).
    """

    __slots__ = ("_unknown", "_present")
    _spec: StructSpec
    _fields: tuple[str, ...] = ()

    def __init__(self, **values: Any):
        spec_fields = self._spec.fields
        for f in spec_fields:
            v = values.pop(f.name, _UNSET)
            object.__setattr__(self, f.name, f.fresh_default() if v is _UNSET else v)
        unknown = values.pop("unknown_tags", None)
        if values:
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(values)}")
        self._unknown = dict(unknown) if unknown else None
        self._present = None

    @classmethod
    def defaults(cls) -> "Struct":
        """A new instance with every field at its default."""
        return cls()

    # -- mapping-style access --------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        if name in self._fields:
            return getattr(self, name)
        raise KeyError(name)

    def __setitem__(self, name: str, value: Any) -> None:
        if name not in self._fields:
            raise KeyError(name)
        setattr(self, name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def keys(self) -> tuple[str, ...]:
        """The spec's field names, in spec order."""
        return self._fields

    def items(self) -> Iterator[tuple[str, Any]]:
        """``(field name, value)`` for every field of the spec, in spec order."""
        for n in self._fields:
            yield n, getattr(self, n)

    def get(self, name: str, default: Any = None) -> Any:
        """The value of field ``name``, or ``default`` when the spec has no such field."""
        return getattr(self, name) if name in self._fields else default

    @property
    def unknown_tags(self) -> dict[int, bytes]:
        """Unknown tagged fields as ``{tag: raw bytes}`` (a live dict; empty if none)."""
        if self._unknown is None:
            self._unknown = {}
        return self._unknown

    @unknown_tags.setter
    def unknown_tags(self, value: dict[int, bytes] | None) -> None:
        self._unknown = dict(value) if value else None

    # -- value semantics -------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for n in self._fields:
            a, b = getattr(self, n), getattr(other, n)
            if a is not b and a != b:  # (identity first, as lists compare items: the
                return False           # shared NaN of a NaN default equals itself)
        return (self._unknown or None) == (other._unknown or None)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [f"{n}={getattr(self, n)!r}" for n in self._fields]
        if self._unknown:
            parts.append(f"unknown_tags={self._unknown!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def copy(self) -> "Struct":
        """A deep copy (lists and nested structs are copied)."""
        new = object.__new__(type(self))
        for n in self._fields:
            object.__setattr__(new, n, copy_value(getattr(self, n)))
        new._unknown = dict(self._unknown) if self._unknown else None
        new._present = getattr(self, "_present", None)
        return new

    # -- plain dicts -----------------------------------------------------------
    def to_dict(self, version: int | None = None) -> dict[str, Any]:
        """A JSON-able dict keyed by spec field names.

        bytes and records become base64 strings, uuids Kafka's text form (URL-safe
        base64), nested structs dicts; unknown tagged fields appear under
        ``"_unknown_tags"`` as ``{"tag": "hex"}``, and the tags of known tagged fields
        that were on the wire at their default value (which the encoder would
        otherwise leave out, KIP-482) under ``"_present_tags"`` as a sorted list of
        ints. :meth:`from_dict` reverses it, so the struct encodes to the same bytes.

        ``version``: the message version the struct was decoded at (or is to be
        encoded at). Only the fields on the wire at it are given, as Kafka's generated
        JSON converters write them (``*JsonConverter.write``): a field outside its
        ``versions`` is left out, and a tagged field is given only when it is
        written (not at its default, or seen on the wire). ``None``: every field of
        the spec, at its default where the version has none.
        """
        out: dict[str, Any] = {}
        present = getattr(self, "_present", None)  # the C decoder may leave it unset
        if version is None:
            for f in self._spec.fields:
                out[f.name] = _to_plain(f, getattr(self, f.name), None)
        else:
            for f in self._spec.fields:
                if not f.versions.contains(version):
                    continue
                v = getattr(self, f.name)
                if f.tagged_in(version) and not tag_written(f, v, present):
                    continue
                out[f.name] = _to_plain(f, v, version)
        if self._unknown:
            out["_unknown_tags"] = {str(t): bytes(b).hex() for t, b in self._unknown.items()}
        if present:
            out["_present_tags"] = sorted(present)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Struct":
        """Build an instance from :meth:`to_dict`'s shape; missing fields take defaults.

        Raises:
            EncodeError: on unknown keys or values of the wrong shape.
        """
        if not isinstance(data, dict):
            raise EncodeError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
        obj = cls()
        known = set(cls._fields)
        for key, val in data.items():
            if key == "_unknown_tags":
                obj._unknown = _unknown_tags(cls, val)
                continue
            if key == "_present_tags":
                obj._present = _present_tags(cls, val)
                continue
            if key not in known:
                raise EncodeError(f"{cls.__name__} has no field {key!r}")
            f = cls._spec.field(key)
            setattr(obj, key, _from_plain(f, val, f"{cls.__name__}.{key}"))
        return obj


_MAX_TAG = 0xFFFFFFFF  # a tag is an unsigned varint of at most 32 bits (KIP-482)


def _unknown_tags(cls: type, val: Any) -> dict[int, bytes] | None:
    """``"_unknown_tags"`` of :meth:`Struct.from_dict`: ``{"tag": "hex"}`` as
    :meth:`Struct.to_dict` writes it, checked (EncodeError, not the ValueError,
    TypeError or AttributeError of ``int()``/``bytes.fromhex`` on bad input)."""
    if val is None:
        return None
    where = f"{cls.__name__}._unknown_tags"
    if not isinstance(val, dict):
        raise EncodeError(f"expected an object {{\"tag\": \"hex bytes\"}}, got "
                          f"{type(val).__name__}", where)
    out: dict[int, bytes] = {}
    for t, data in val.items():
        tag = None
        if isinstance(t, str) and t.isascii() and t.isdigit():
            tag = int(t)
        elif type(t) is int:
            tag = t
        if tag is None or not 0 <= tag <= _MAX_TAG:
            raise EncodeError(f"tag {t!r} is not a tag number (an integer from 0 to "
                              f"{_MAX_TAG})", where)
        if tag in out:
            raise EncodeError(f"tag {tag} given twice", where)
        if not isinstance(data, str):
            raise EncodeError(f"tag {tag}: expected a hex string, got {type(data).__name__}",
                              where)
        try:
            out[tag] = bytes.fromhex(data)
        except ValueError as e:
            raise EncodeError(f"tag {tag}: {data!r} is not hex: {e}", where) from None
    return out or None


def _present_tags(cls: type, val: Any) -> frozenset[int] | None:
    """``"_present_tags"`` of :meth:`Struct.from_dict`: the tags of ``cls``'s known
    tagged fields, checked."""
    if val is None:
        return None
    known = {f.tag for f in cls._spec.fields if f.tag is not None}
    if not isinstance(val, list) or not all(type(t) is int and t in known for t in val):
        raise EncodeError(f"{cls.__name__}._present_tags must be a list of the tags of its "
                          f"tagged fields {sorted(known)}, got {val!r}")
    return frozenset(val) or None


def java_string(s: str | None) -> str | None:
    """The string Kafka's Java reader makes of the bytes ``s`` was decoded from.

    kinspect decodes strings with the ``surrogateescape`` error handler (invalid UTF-8
    becomes lone surrogates U+DC80..U+DCFF, so the value encodes back to the same
    bytes); Java's ``new String(bytes, UTF_8)`` replaces it with U+FFFD instead. Use
    this where a decoded string leaves kinspect for something that needs valid
    Unicode (Arrow/Parquet columns, strict UTF-8 writers); the value itself is
    returned when it has no lone surrogates.
    """
    if s is None or s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def copy_value(v: Any) -> Any:
    """A deep copy of a field value: structs and lists are copied, the rest is
    immutable and shared."""
    if isinstance(v, Struct):
        return Struct.copy(v)  # (not v.copy(): a spec field may be named copy)
    if isinstance(v, list):
        return [copy_value(x) for x in v]
    return v


def _prim_to_plain(t: str, v: Any) -> Any:
    if v is None:
        return None
    if t in ("bytes", "records"):
        return base64.b64encode(bytes(v)).decode("ascii")
    if t == "uuid":
        return uuid_to_text(v)
    return v


def _to_plain(f: FieldSpec, v: Any, version: int | None) -> Any:
    if v is None:
        return None
    if f.struct is not None:
        if f.is_array:
            return [x.to_dict(version) for x in v]
        return v.to_dict(version)
    if f.is_array:
        t = f.element_type
        return [_prim_to_plain(t, x) for x in v]
    return _prim_to_plain(f.type, v)


def tag_written(f: FieldSpec, val: Any, present: frozenset | None) -> bool:
    """Whether the encoder writes tagged field ``f`` holding ``val``: when it differs
    from the field's default, or when its tag is in ``present`` (the struct's tags the
    decoder saw on the wire, :attr:`Struct._present`). KIP-482."""
    if present and f.tag in present:
        return True
    if f.is_array:
        if f.default_text == "null":
            return val is not None
        return val is None or len(val) > 0
    if f.struct is not None:
        if f.default_text == "null":
            return val is not None
        return val != struct_class(f.struct)()
    if nan_default(f):
        return val == val
    return val != f.default


def nan_default(f: FieldSpec) -> bool:
    """Whether ``f`` is a float64 field whose default is NaN (``"default": "NaN"``):
    a value is then at its default when it is a NaN, any NaN, since ``NaN != NaN``
    would make every value differ from it (and a field absent on the wire be written
    back, or refused at a version without it)."""
    d = f.default
    return type(d) is float and d != d


def _prim_from_plain(t: str, v: Any, where: str) -> Any:
    if v is None:
        return None
    try:
        if t in ("bytes", "records"):
            if isinstance(v, (bytes, bytearray, memoryview)):
                return bytes(v)
            return base64.b64decode(v, validate=True)
        if t == "uuid":
            if isinstance(v, (bytes, bytearray)) and len(v) == 16:
                return bytes(v)
            if isinstance(v, str) and len(v) == 36:
                import uuid as _uuid
                return _uuid.UUID(v).bytes
            return uuid_from_text(v)
        if t == "float64":
            return float(v)
        if t == "bool":
            if not isinstance(v, bool):
                raise ValueError("expected a boolean")
            return v
        if t == "string":
            if not isinstance(v, str):
                raise ValueError("expected a string")
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("expected an integer")
        return v
    except (ValueError, TypeError) as e:
        raise EncodeError(f"bad {t} value {v!r}: {e}", where) from None


def _from_plain(f: FieldSpec, v: Any, where: str) -> Any:
    if v is None:
        return None
    if f.struct is not None:
        cls = f.struct.cls
        if f.is_array:
            if not isinstance(v, list):
                raise EncodeError("expected a list", where)
            return [cls.from_dict(x) for x in v]
        return cls.from_dict(v)
    if f.is_array:
        if not isinstance(v, list):
            raise EncodeError("expected a list", where)
        return [_prim_from_plain(f.element_type, x, where) for x in v]
    return _prim_from_plain(f.type, v, where)


def attribute_alias(name: str) -> str:
    """The attribute name generated code uses for the spec field ``name``.

    That is ``name`` itself, or ``name + "_"`` when ``name`` is a Python keyword:
    Kafka's generator takes any ``[A-Za-z][A-Za-z0-9]*`` field name (``FieldSpec``),
    ``None`` or ``pass`` included, which ``o.None`` cannot spell. The struct class
    has such a field under its own name (``getattr(o, "None")``, ``o["None"]``) and
    under the alias, a property over the same slot (``o.None_``); a spec field name
    has no ``_``, so the alias never meets another field's name.
    """
    return name + "_" if keyword.iskeyword(name) else name


def struct_class(spec: StructSpec) -> type[Struct]:
    """The value class of a struct spec, created once and cached on the spec.

    The class gets a generated keyword-only ``__init__`` (one parameter per spec
    field plus ``unknown_tags``; omitted fields take fresh defaults), so building
    values, including the default structs a decoder fills in for absent fields,
    costs one plain Python call.
    """
    if spec.cls is not None:
        return spec.cls
    names = tuple(f.name for f in spec.fields)
    cls = type(spec.name, (Struct,), {"__slots__": names, "_fields": names, "_spec": spec,
                                      "__module__": "kinspect.codec.messages"})
    spec.cls = cls
    for n in names:
        alias = attribute_alias(n)
        if alias != n:
            slot = cls.__dict__[n]
            setattr(cls, alias, property(slot.__get__, slot.__set__,
                                         doc=f"The field {n} (a Python keyword)."))
    for f in spec.fields:
        if f.struct is not None:
            struct_class(f.struct)
    init = _generated_init(spec)
    if init is not None:
        cls.__init__ = init
    return cls


_IMMUTABLE = (type(None), bool, int, float, str, bytes)


def _generated_init(spec: StructSpec):
    """A fast ``__init__`` for the struct's class, or ``None`` when the field names
    cannot be Python parameters (the generic ``Struct.__init__`` is kept then)."""
    names = [f.name for f in spec.fields]
    if any(keyword.iskeyword(n) or n in ("unknown_tags", "_s_", "_U_") or n.startswith("_d_")
           for n in names):
        return None
    ns: dict[str, Any] = {"_U_": _UNSET, "_dict": dict}
    params, body = [], []
    for f in spec.fields:
        n = f.name
        if f.is_array:
            params.append(f"{n}=_U_")
            dflt = "None" if f.default_text == "null" else "[]"
            body.append(f"_s_.{n} = {dflt} if {n} is _U_ else {n}")
        elif f.struct is not None:
            params.append(f"{n}=_U_")
            if f.default_text == "null":
                body.append(f"_s_.{n} = None if {n} is _U_ else {n}")
            else:
                ns[f"_d_{n}"] = f.struct.cls
                body.append(f"_s_.{n} = _d_{n}() if {n} is _U_ else {n}")
        elif type(f.default) in _IMMUTABLE:
            ns[f"_d_{n}"] = f.default
            params.append(f"{n}=_d_{n}")
            body.append(f"_s_.{n} = {n}")
        else:  # pragma: no cover - every primitive default is immutable
            return None
    params.append("unknown_tags=None")
    body.append("_s_._unknown = _dict(unknown_tags) if unknown_tags else None")
    body.append("_s_._present = None")
    src = f"def __init__(_s_, *, {', '.join(params)}):\n    " + "\n    ".join(body) + "\n"
    # (not through the code cache: for a function this small, compiling takes less
    # time than finding and loading a cache entry, measured in BENCHMARKS.md)
    exec(compile(src, f"<kinspect {spec.name}.__init__>", "exec"), ns)
    fn = ns["__init__"]
    fn.__qualname__ = f"{spec.name}.__init__"
    fn.__doc__ = f"Build a {spec.name}; omitted fields take their spec defaults."
    return fn
