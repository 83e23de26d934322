"""Broker address rewriting, found through the specs.

Brokers advertise their own addresses in Metadata, FindCoordinator and
DescribeCluster responses and, since KIP-951, in the ``NodeEndpoints`` tagged
field of Produce and Fetch responses. A proxy that leaves one of them alone lets
clients connect around it. Rather than hard-coding those APIs, every response
spec is searched for *endpoint structs*: structs with a string ``Host``, an int32
``Port`` and a broker id (``entityType: brokerId``) beside them.

The proxy splices the new addresses into the broker's bytes
(:meth:`AddressRewriter.splice`): the rest of the response crosses byte for byte,
however the broker encoded it. :meth:`AddressRewriter.rewrite` changes decoded
bodies instead (for what re-encodes them anyway, and as the independent reference
the splicing is tested against).
"""

from __future__ import annotations

import struct
from typing import Callable

from ..codec.compiler import read_compact_prefix, read_uvarint
from ..codec.errors import DecodeError, KinspectError
from ..codec.registry import SpecRegistry
from ..codec.scan import Located, compile_locator
from ..codec.spec import FieldSpec, MessageSpec, StructSpec
from ..codec.values import Struct

#: (broker id or None, upstream host, upstream port) -> (advertised host, port)
Mapper = Callable[[int | None, str, int], tuple[str, int]]


class Unspliceable(KinspectError):
    """A response version whose endpoints cannot be spliced: a ``Host`` or ``Port``
    that is a tagged field (writing one that was left out would mean adding to a
    tag section) or missing at that version. No Kafka spec has one."""


def _is_endpoint(st: StructSpec) -> tuple[str, FieldSpec] | None:
    names = {f.name: f for f in st.fields}
    host, port = names.get("Host"), names.get("Port")
    if host is None or port is None or host.type != "string" or port.type != "int32":
        return None
    node = next((f.name for f in st.fields if f.entity_type == "brokerId"
                 and f.type == "int32"), None)
    if node is None:
        return None
    return node, host


def endpoint_paths(spec: MessageSpec) -> list[tuple[tuple[FieldSpec, ...], str]]:
    """Paths (sequences of fields from the top level) to every endpoint struct of a
    message, each with the name of its broker-id field; ``()`` is the top level.
    The last element of each path is the struct's ``Host`` field, so that a path
    applies to a version only when every field on it exists in that version."""
    out: list[tuple[tuple[FieldSpec, ...], str]] = []

    def walk(st: StructSpec, path: tuple[FieldSpec, ...], depth: int) -> None:
        ep = _is_endpoint(st)
        if ep is not None:
            out.append((path + (ep[1],), ep[0]))
        if depth > 6:
            return
        for f in st.fields:
            if f.struct is not None:
                walk(f.struct, path + (f,), depth + 1)

    walk(spec.struct, (), 0)
    return out


class AddressRewriter:
    """Finds and rewrites broker addresses in responses: in their bytes
    (:meth:`splice`) or in decoded bodies (:meth:`rewrite`)."""

    def __init__(self, registry: SpecRegistry):
        self.registry = registry
        self._paths: dict[int, list] = {}
        self._locators: dict[tuple[int, int], tuple[Located, list[FieldSpec]]] = {}

    def paths(self, api_key: int) -> list:
        p = self._paths.get(api_key)
        if p is None:
            spec = self.registry.response(api_key)
            if spec is None:
                return []  # not remembered: request headers may name any api key
            p = self._paths[api_key] = endpoint_paths(spec)
        return p

    def needs_rewrite(self, api_key: int, api_version: int) -> bool:
        """Whether responses of this api version can carry broker addresses."""
        for path, node_field in self.paths(api_key):
            if all(f.versions.contains(api_version) for f in path):
                return True
        return False

    def trigger_tags(self, api_key: int, api_version: int) -> frozenset[int] | None:
        """When every endpoint of this api version sits under a top-level tagged
        field (KIP-951 ``NodeEndpoints`` of Produce and Fetch responses), the tags of
        those fields: a response without any of them in its top-level tag section
        has no address to rewrite. ``None`` when some endpoint is always on the wire
        (Metadata, FindCoordinator, DescribeCluster...)."""
        tags = set()
        for path, _node in self.paths(api_key):
            if not all(f.versions.contains(api_version) for f in path):
                continue
            if len(path) < 2 or not path[0].tagged_in(api_version):
                return None
            tags.add(path[0].tag)
        return frozenset(tags)

    def rewrite(self, api_key: int, api_version: int, body: Struct, mapper: Mapper) -> int:
        """Rewrite every endpoint in ``body`` in place; return how many changed."""
        changed = 0
        for path, node_field in self.paths(api_key):
            if not all(f.versions.contains(api_version) for f in path):
                continue
            for st in _follow(body, path):
                host, port = st.Host, st.Port
                node = getattr(st, node_field)
                if not _real_endpoint(node, host, port):
                    continue
                new_host, new_port = mapper(node, host, port)
                if (new_host, new_port) != (host, port):
                    st.Host, st.Port = new_host, new_port
                    changed += 1
        return changed

    def splice(self, api_key: int, api_version: int, frame: bytes, body_offset: int,
               mapper: Mapper) -> tuple[bytes, int]:
        """Rewrite every endpoint in a response frame by splicing: only the bytes of
        each changed ``Host`` and ``Port`` are replaced, and the size of each
        tagged field around them (KIP-482) adjusted; every other byte stays as the
        broker sent it, however it encoded it (non-minimal varints, a boolean byte
        other than 0 or 1, tags out of order: what re-encoding would change). A
        varint length prefix or size the broker wrote wider than needed keeps its
        width where the new value fits in it; the others are written minimal. The
        mapper is called for each endpoint in wire order; a broker id that is not
        on the wire (a tagged field left out, a field of later versions) is its
        default, as in a decoded body.

        Args:
            frame: the response frame without its size prefix (header included).
            body_offset: where its body starts.

        Bytes after the body (which Kafka's parsers ignore: see
        :mod:`kinspect.codec.protocol`) stay as they are after it.

        Returns:
            ``(new frame, endpoints changed)``; the frame itself when none changed.
        Raises:
            DecodeError: the body does not walk (it runs past the end of the frame).
            Unspliceable: a ``Host`` or ``Port`` of this version is a tagged field
                or missing (no Kafka spec has one; use :meth:`rewrite`).
        """
        loc = self._locators.get((api_key, api_version))
        if loc is None:
            loc = self._locators[(api_key, api_version)] = self._locator(api_key, api_version)
        located, fields = loc
        try:
            end, spans, sizes = located.locate(frame, body_offset, len(frame))
        except (IndexError, struct.error):
            raise DecodeError("truncated response", offset=len(frame)) from None
        if end > len(frame):
            raise DecodeError("truncated response", offset=len(frame))
        groups: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}
        for g, i, a, b in spans:
            groups.setdefault((g, i // 3), {})[i % 3] = (a, b)
        edits: list[tuple[int, int, bytes]] = []
        changed = 0
        for (_, k), at in groups.items():
            _, port_f, node_f = fields[3 * k:3 * k + 3]
            h = 3 * k
            host = _read_string(frame, *at[0], located.compact[h])
            port_enc = port_f.encoding_in(api_version)
            port = _read_int(frame, *at[1], port_enc)
            node = (_read_int(frame, *at[2], node_f.encoding_in(api_version)) if 2 in at
                    else node_f.fresh_default())
            if not _real_endpoint(node, host, port):
                continue
            new_host, new_port = mapper(node, host, port)
            changed += (new_host, new_port) != (host, port)
            if new_host != host:
                edits.append((*at[0], _string(new_host, frame, *at[0], located.compact[h])))
            if new_port != port:
                edits.append((*at[1], _int(new_port, port_enc, frame, *at[1])))
        if not edits:
            return frame, 0
        edits += _size_edits(frame, edits, sizes)
        edits.sort()
        out: list[bytes] = []
        pos = 0
        for a, b, new in edits:
            out.append(frame[pos:a])
            out.append(new)
            pos = b
        out.append(frame[pos:])
        return b"".join(out), changed

    def _locator(self, api_key: int, api_version: int) -> tuple[Located, list[FieldSpec]]:
        """The locator of every endpoint's Host, Port and broker id at a version
        (three paths per endpoint path, the broker id's left out where it is not
        in the version), and the three fields of each."""
        spec = self.registry.response(api_key)
        if spec is None:
            raise DecodeError(f"no spec for api key {api_key}", offset=0)
        fields: list[FieldSpec] = []
        paths: list[tuple[FieldSpec, ...]] = []
        for path, node_field in self.paths(api_key):
            if not all(f.versions.contains(api_version) for f in path):
                continue
            owner = path[-2].struct if len(path) > 1 else spec.struct
            names = {f.name: f for f in owner.fields}
            host, port, node = path[-1], names["Port"], names[node_field]
            for f in (host, port):
                if not f.versions.contains(api_version) or f.tagged_in(api_version):
                    raise Unspliceable(f"{spec.name} v{api_version}: {f.name} is "
                                       f"{'tagged' if f.versions.contains(api_version) else 'missing'}")
            fields += (host, port, node)
            paths += (path, path[:-1] + (port,), path[:-1] + (node,))
            if not node.versions.contains(api_version):
                paths[-1] = ()  # (never on the wire: its default)
        index = [i for i, p in enumerate(paths) if p]
        located = compile_locator(spec, api_version, [paths[i] for i in index])
        if len(index) != len(paths):  # renumber the spans to the three-per-endpoint scheme
            inner = located.locate
            compact = [False] * len(paths)
            for n, i in enumerate(index):
                compact[i] = located.compact[n]

            def locate(buf, pos, end, inner=inner, index=index):
                end_, spans, sizes = inner(buf, pos, end)
                return end_, [(g, index[i], a, b) for g, i, a, b in spans], sizes

            located = Located(locate, compact)
        return located, fields

    def endpoints(self, api_key: int, api_version: int, body: Struct) -> list[tuple[int, str, int]]:
        """``(broker id, host, port)`` of every endpoint in ``body``."""
        out = []
        for path, node_field in self.paths(api_key):
            if all(f.versions.contains(api_version) for f in path):
                for st in _follow(body, path):
                    if _real_endpoint(getattr(st, node_field), st.Host, st.Port):
                        out.append((getattr(st, node_field), st.Host, st.Port))
        return out


def _real_endpoint(node: int | None, host: str | None, port: int) -> bool:
    """False for the placeholders of error answers (e.g. FindCoordinator's
    COORDINATOR_NOT_AVAILABLE: NodeId -1, Host "", Port -1), which stay untouched."""
    return bool(host) and 0 < port <= 65535 and (node is None or node >= 0)


def _size_edits(frame: bytes, edits: list[tuple[int, int, bytes]],
                sizes: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
    """The new size varints of the tagged fields (``sizes``: size start, data start,
    data end; properly nested) whose data ``edits`` change, in one sweep over both
    in wire order: each field's change is passed to the field around it once it
    ends (its data's change plus its size varint's own)."""
    out: list[tuple[int, int, bytes]] = []
    items = sorted([(a, 1, b - a, len(new) - (b - a)) for a, b, new in edits] +
                   [(z, 0, q0, q1) for z, q0, q1 in sizes])
    stack: list[list[int]] = []  # [data end, change so far, size start, data start]

    def close(upto: int) -> None:
        while stack and stack[-1][0] <= upto:
            _, delta, z, q0 = stack.pop()
            if delta:
                old = read_uvarint(frame, z)[0]
                new = _uvarint(old + delta, _width(old, q0 - z))
                out.append((z, q0, new))
                delta += len(new) - (q0 - z)
                if stack:
                    stack[-1][1] += delta

    for pos, kind, x, y in items:
        close(pos)
        if kind == 0:  # a tagged field starts: (size start, data start, data end)
            stack.append([y, 0, pos, x])
        elif stack:  # an edit inside the innermost open tagged field
            stack[-1][1] += y
    close(len(frame) + 1)
    return out


def _width(old: int, width: int) -> int:
    """The width to write a varint replacing one of ``width`` bytes that held ``old``
    in: that width if the broker wrote it wider than needed (a non-minimal varint, as
    Kafka's readers accept), else 1 (minimal, as the broker writes them)."""
    return width if width > len(_uvarint(old)) else 1


def _uvarint(n: int, width: int = 1) -> bytes:
    """``n`` as an unsigned varint of at least ``width`` bytes."""
    out = bytearray()
    while True:
        width -= 1
        if n >= 0x80 or width > 0:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


def _read_string(frame: bytes, a: int, b: int, compact: bool) -> str | None:
    if compact:
        n, p = read_compact_prefix(frame, a)
        n -= 1
    else:
        n, p = struct.unpack_from(">h", frame, a)[0], a + 2
    # (bytes that are not UTF-8 read as the decoder reads them)
    return None if n < 0 else frame[p:p + n].decode("utf-8", "surrogateescape")


def _string(s: str, frame: bytes, a: int, b: int, compact: bool) -> bytes:
    data = s.encode("utf-8", "surrogateescape")  # (as the codec encodes strings)
    if not compact:
        return struct.pack(">h", len(data)) + data
    old, end = read_uvarint(frame, a)
    return _uvarint(len(data) + 1, _width(old, end - a)) + data


def _read_int(frame: bytes, a: int, b: int, encoding: str) -> int:
    if encoding == "fixed":
        return int.from_bytes(frame[a:b], "big", signed=True)
    v = read_uvarint(frame, a, 10)[0]
    return (v >> 1) ^ -(v & 1) if encoding == "packed" else v


def _int(n: int, encoding: str, frame: bytes, a: int, b: int) -> bytes:
    """``n`` in the place of the int field at ``frame[a:b]``, in its encoding."""
    if encoding == "fixed":
        return n.to_bytes(b - a, "big", signed=True)
    if encoding == "packed":
        n = (n << 1) ^ (n >> 63)
    return _uvarint(n, _width(read_uvarint(frame, a, 10)[0], b - a))


def _follow(obj: Struct, path: tuple[FieldSpec, ...]):
    items = [obj]
    for f in path[:-1]:  # the last element is the Host field itself
        nxt = []
        for it in items:
            v = getattr(it, f.name)
            if v is None:
                continue
            if isinstance(v, list):
                nxt.extend(v)
            else:
                nxt.append(v)
        items = nxt
    return items
