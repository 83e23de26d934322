"""Whether the C fast path of the decoder (``kinspect.codec._native``) is used.

The extension is built by ``pip install`` where a C compiler is available
(``setup.py``; optional, so installing never fails for want of one). When it is
importable, :class:`~kinspect.codec.registry.MessageCodec` decodes with it first and
runs the generated Python decoder only for input the C code does not accept (to
raise the precise :class:`~kinspect.codec.errors.DecodeError`) — the values are the
same either way.

Environment:
    KINSPECT_NATIVE: ``0`` turns the C fast path off (the generated Python decoder
        alone); ``1`` requires it (:func:`native_module` raises ImportError when it
        is not built). Unset: used when available.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

#: the interface version this Python code expects of the extension (``_native.ABI``)
ABI = 8

log = logging.getLogger("kinspect.codec")


def native_module() -> ModuleType | None:
    """The ``_native`` extension module, or ``None`` when it is off, not built, or
    built from an older ``_native.c`` (an editable install keeps the old binary until
    ``pip install -e .`` runs again; a warning says so).

    Raises:
        ImportError: ``KINSPECT_NATIVE=1`` and the extension is not importable or
            is stale.
    """
    want = os.environ.get("KINSPECT_NATIVE", "").strip()
    if want == "0":
        return None
    try:
        from . import _native
    except ImportError:
        if want == "1":
            raise
        return None
    if getattr(_native, "ABI", None) != ABI:
        msg = (f"kinspect.codec._native ({_native.__file__}) was built from another "
               f"version of _native.c (ABI {getattr(_native, 'ABI', None)}, expected {ABI}): "
               f"rebuild it with `pip install -e .`")
        if want == "1":
            raise ImportError(msg)
        log.warning("%s; decoding in Python meanwhile", msg)
        return None
    return _native
