"""Round trip with kcat: produce the values (one per line), consume them in a group.

kcat cannot create topics: this relies on the broker creating the topic on
first use (noida-db does). Config: JSON in argv[1] (see __init__.py); a
``debug`` entry is passed on as ``kcat -d``. Prints {"consumed": [...]} last.
"""

import json
import shutil
import subprocess
import sys
import time

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


def kcat(args: list[str], deadline: float, stdin: str = "") -> str:
    """Run kcat, echo its stderr, return its stdout; raise if it fails."""
    proc = subprocess.run(
        [KCAT, *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=max(0.1, deadline - time.monotonic()),
    )
    sys.stderr.write(proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"kcat {' '.join(args)} exited with {proc.returncode}")
    return proc.stdout


def main(cfg: dict) -> list[str]:
    deadline = time.monotonic() + cfg["timeout"]
    common = ["-b", cfg["bootstrap"], "-X", "client.id=kinspect-kcat"]
    if cfg.get("debug"):
        common += ["-d", cfg["debug"]]
    values = cfg["values"]
    if any("\n" in v for v in values):
        raise ValueError("kcat values are newline-delimited: no value may hold a newline")
    idempotence = "true" if cfg.get("idempotent") else "false"
    kcat(
        ["-P", *common, "-t", cfg["topic"], "-X", f"enable.idempotence={idempotence}"],
        deadline,
        stdin="".join(v + "\n" for v in values),
    )
    out = kcat(
        [
            *common,
            "-G",
            cfg["group"],
            "-X",
            "auto.offset.reset=earliest",
            "-X",
            f"session.timeout.ms={cfg['session_timeout_ms']}",
            "-X",
            f"heartbeat.interval.ms={cfg['heartbeat_interval_ms']}",
            "-c",
            str(len(values)),
            "-f",
            "%s\\n",
            cfg["topic"],
        ],
        deadline,
    )
    return out.splitlines()


if __name__ == "__main__":
    if KCAT is None:
        sys.exit("kcat is not installed (Debian: apt-get install kcat)")
    print(json.dumps({"consumed": main(json.loads(sys.argv[1]))}))
