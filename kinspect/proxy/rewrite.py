"""Broker address rewriting, found through the specs.

Brokers advertise their own addresses in Metadata, FindCoordinator and
DescribeCluster responses and, since KIP-951, in the ``NodeEndpoints`` tagged
field of Produce and Fetch responses. A proxy that leaves one of them alone lets
clients connect around it. Rather than hard-coding those APIs, every response
spec is searched for *endpoint structs*: structs with a string ``Host``, an int32
``Port`` and a broker id (``entityType: brokerId``) beside them.
"""

from __future__ import annotations

from typing import Callable

from ..codec.registry import SpecRegistry
from ..codec.spec import FieldSpec, MessageSpec, StructSpec
from ..codec.values import Struct

#: (broker id or None, upstream host, upstream port) -> (advertised host, port)
Mapper = Callable[[int | None, str, int], tuple[str, int]]


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
    """Rewrites broker addresses in decoded response bodies."""

    def __init__(self, registry: SpecRegistry):
        self.registry = registry
        self._paths: dict[int, list] = {}

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
