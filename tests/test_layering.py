"""The codec is sans-io: importing and using it pulls in no event loop, sockets, UI or Spark."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("asyncio", "socket", "rich", "pyspark", "uvloop", "selectors")


def test_codec_imports_no_io_or_ui_modules():
    code = (
        "import sys\n"
        "import kinspect.codec as c\n"
        "import kinspect.codec.records, kinspect.codec.frames\n"
        "codec = c.Codec()\n"
        "codec.request_codec(3).encode(codec.request_codec(3).cls(), 12)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"kinspect.codec imported {out}"
