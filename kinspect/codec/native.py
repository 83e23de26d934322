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

import os
from types import ModuleType


def native_module() -> ModuleType | None:
    """The ``_native`` extension module, or ``None`` when it is off or not built.

    Raises:
        ImportError: ``KINSPECT_NATIVE=1`` and the extension is not importable.
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
    return _native
