"""Helpers for the codec tests: the Kafka spec corpus and small inline specs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kinspect.codec import Codec, MessageCodec, SpecRegistry

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("KINSPECT_KAFKA_SPECS", REPO.parent / "shared" / "kafka-message-specs"))

_CORPUS_REG: SpecRegistry | None = None


def corpus_registry() -> SpecRegistry:
    """Apache Kafka's specs plus the generator's test specs (loaded once)."""
    global _CORPUS_REG
    if _CORPUS_REG is None:
        dirs = [CORPUS / "message", CORPUS / "test-message"]
        missing = [d for d in dirs if not d.is_dir()]
        if missing:
            raise FileNotFoundError(f"spec corpus missing: {missing} (set KINSPECT_KAFKA_SPECS)")
        _CORPUS_REG = SpecRegistry.load([str(d) for d in dirs], use_env=False,
                                        use_project=False, use_default=False)
    return _CORPUS_REG


def corpus_codec() -> Codec:
    return Codec(corpus_registry())


def inline(doc: dict | str, source: str = "inline.json") -> MessageCodec:
    """The codec of one spec given as a dict or JSON text."""
    reg = SpecRegistry()
    spec = reg.add_text(doc if isinstance(doc, str) else json.dumps(doc), source)
    return reg.codec(spec)


def h(text: str) -> bytes:
    """Bytes from hex with spaces and ``|`` separators allowed."""
    return bytes.fromhex(text.replace("|", " "))
