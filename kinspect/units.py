"""Byte sizes as people write them on command lines and in rules files."""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+)\s*(?:([kKmMgG])(?:i?[bB])?|[bB])?\s*")
_FACTOR = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str | int) -> int:
    """``1024``, ``"16b"``, ``"64K"``, ``"1KiB"``, ``"1 MiB"``, ``"2G"`` → bytes
    (binary multiples: K = 1024).

    Raises:
        ValueError: anything else.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise ValueError(f"expected a size like 1000000, 64K, 1MiB or 1G, got {text!r}")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _FACTOR[unit]
