"""Version ranges as written in Kafka's message specs (``"0+"``, ``"1-3"``, ``"4"``,
``"none"``), modelled on Kafka's generator class ``Versions``."""

from __future__ import annotations

from typing import NamedTuple

MAX_VERSION = 0x7FFF  # versions are int16 on the wire


class Versions(NamedTuple):
    """An inclusive range ``[lowest, highest]`` of int16 versions; empty when
    ``lowest > highest`` (:data:`NONE`)."""

    lowest: int
    highest: int

    @classmethod
    def parse(cls, text: str | int | None, default: "Versions | None" = None) -> "Versions":
        """Parse ``"N+"``, ``"N-M"``, ``"N"`` or ``"none"``, or an int ``N`` (a JSON
        number); every version is an int16 that is not negative.

        Raises:
            ValueError: on anything else (``true`` included), a version outside
                ``0..MAX_VERSION``, or a range with ``N > M``.
        """
        if text is None:
            if default is None:
                raise ValueError("missing version range")
            return default
        if isinstance(text, bool) or not isinstance(text, (str, int)):
            raise ValueError(f"invalid version range {text!r}: not a string or an integer")
        if isinstance(text, int):
            try:
                return cls(_check_int16(text), text)
            except ValueError as e:
                raise ValueError(f"invalid version range {text!r}: {e}") from None
        s = text.strip()
        if s == "none":
            return NONE
        try:
            if s.endswith("+"):
                return cls(_int16(s[:-1]), MAX_VERSION)
            if "-" in s:
                lo, hi = s.split("-", 1)
                lo_v, hi_v = _int16(lo), _int16(hi)
                if lo_v > hi_v:
                    raise ValueError(f"invalid version range {text!r}: {lo_v} > {hi_v}")
                return cls(lo_v, hi_v)
            v = _int16(s)
            return cls(v, v)
        except ValueError as e:
            raise ValueError(f"invalid version range {text!r}: {e}") from None

    @property
    def empty(self) -> bool:
        """No version at all (``"none"``)."""
        return self.lowest > self.highest

    def __contains__(self, version: object) -> bool:  # type: ignore[override]
        return isinstance(version, int) and self.lowest <= version <= self.highest

    def contains(self, version: int) -> bool:
        """``lowest <= version <= highest`` (an int, unchecked: the fast form of ``in``)."""
        return self.lowest <= version <= self.highest

    def intersect(self, other: "Versions") -> "Versions":
        """The versions in both (:data:`NONE` when they do not overlap)."""
        lo, hi = max(self.lowest, other.lowest), min(self.highest, other.highest)
        return Versions(lo, hi) if lo <= hi else NONE

    def subtract(self, other: "Versions") -> "Versions | None":
        """``self`` minus ``other`` when the result is one range, else ``None``."""
        if other.empty or self.intersect(other).empty:
            return self
        if other.lowest <= self.lowest and other.highest >= self.highest:
            return NONE
        if other.lowest <= self.lowest:
            return Versions(other.highest + 1, self.highest)
        if other.highest >= self.highest:
            return Versions(self.lowest, other.lowest - 1)
        return None

    def is_superset_of(self, other: "Versions") -> bool:
        """Every version of ``other`` is in ``self`` (always true for an empty ``other``)."""
        return other.empty or (self.lowest <= other.lowest and other.highest <= self.highest)

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.highest == MAX_VERSION:
            return f"{self.lowest}+"
        if self.lowest == self.highest:
            return str(self.lowest)
        return f"{self.lowest}-{self.highest}"

    def __repr__(self) -> str:
        return f"Versions({str(self)!r})"


def _int16(s: str) -> int:
    # ASCII digits only: no spaces around a "-" and no "_" separators, which Kafka's
    # generator refuses (Short.parseShort) and Python's int() takes; a sign and
    # non-ASCII digits, which parseShort would take, are refused too (no spec has them)
    if not (s.isascii() and s.isdigit()):
        raise ValueError(f"{s!r} is not a version number")
    return _check_int16(int(s, 10))


def _check_int16(v: int) -> int:
    if not 0 <= v <= MAX_VERSION:
        raise ValueError(f"version {v} out of range 0..{MAX_VERSION}")
    return v


NONE = Versions(1, 0)
ALL = Versions(0, MAX_VERSION)
