"""The capture analysis as a PySpark job.

Run it through ``kinspect analyze CAPTURE... --out DIR [--master URL]``, as a
module (``python -m kinspect.analysis.job CAPTURE... --out DIR``) or with
spark-submit, which supplies the master::

    spark-submit --master spark://host:7077 --py-files kinspect.zip \\
        kinspect/analysis/job.py /shared/captures/ --out /shared/analysis

Pipeline (definitions in :mod:`kinspect.analysis.reference`, which computes the
same tables in one process):

1. capture lines are read with ``spark.read.text`` (gzip by file suffix) and
   parsed with ``from_json``; a torn last line parses to null and is dropped with
   a warning, another line that is not JSON is an error (as the reference reads);
   so are a frame line's ``frame``/``frame_sent`` that is not base64 and an id of
   an appended capture moved past 2**63-1 (the first such line, in file order, is
   named); a line without ``type`` is a frame line, and lone-surrogate escapes
   (``"\\ud800"``) are read as U+FFFD (:func:`_valid_json_text`; definitions in
   :mod:`kinspect.analysis.reference`);
2. frames are numbered per (capture, connection, direction, correlation id) and
   requests joined with responses on (capture, connection, correlation id, n);
3. pairs are decoded on the executors with ``mapInArrow``: each Python worker
   loads the spec set once (:func:`~kinspect.analysis.kernel.load_registry` with
   the paths in the job config) and runs
   :meth:`~kinspect.analysis.kernel.FlowAnalyzer.flow_row`;
4. the tables are aggregated with Spark SQL and written as Parquet under ``--out``;
5. the what-if pass decodes again with the set of fields seen negative anywhere
   (collected from step 3) and sizes every message.

Executors get the spec set from the driver: each source of the driver's search
path (``--specs``, ``KINSPECT_SPECS``, the project's ``specs/``, kafka-python's
bundled set) is zipped and added with ``SparkContext.addFile``; the executors load
exactly those (``SparkFiles.get``) and nothing of their own. ``--no-ship-specs``
passes the paths as they are instead (a shared filesystem), and the executors
then add their own default path. The kinspect code itself is shipped as a zip
(``addPyFile``) when the master is not local, unless ``--no-ship-code``; its
dependencies (json5, cramjam, crc32c, kafka-python) must be installed on the
executors' Python. The zip holds Python files only, so executors decode with the
generated Python decoder; for the decoder's C fast path there, install kinspect on
the executors (``pip install``, with a C compiler) and pass ``--no-ship-code``.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys

if __name__ == "__main__":  # run as a script: its own directory must not shadow modules
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from kinspect.analysis import schema
from kinspect.analysis.reference import PERCENTILES, capture_files, valid_text
from kinspect.analysis.summary import AnalysisResult

#: JSON fields of a capture line the job reads (others are ignored)
LINE_DDL = ("type STRING, ts_ns BIGINT, conn BIGINT, dir STRING, client STRING, "
            "upstream STRING, flow BIGINT, api_key INT, api_version INT, correlation_id INT, "
            "frame STRING, frame_sent STRING, flags ARRAY<STRING>, start_ns BIGINT, part INT, "
            "event STRING")


@dataclass
class JobConfig:
    """What the executors need, passed to them in the task closures.

    Attributes:
        spec_paths: spec sources as the executors see them; with ``shipped`` they
            are file names to resolve with ``SparkFiles.get``.
        shipped: the spec sources were added with ``addFile``.
        defaults: executors also search their own default path (only when the
            specs are not shipped).
    """

    spec_paths: list[str] = field(default_factory=list)
    shipped: bool = False
    defaults: bool = True

    def registry(self):
        from kinspect.analysis.kernel import load_registry

        paths = self.spec_paths
        if self.shipped:
            from pyspark import SparkFiles

            paths = [SparkFiles.get(p) for p in paths]
        return load_registry(paths, defaults=self.defaults)


_ANALYZERS: dict[tuple, Any] = {}
_SIZERS: dict[tuple, Any] = {}


def _analyzer(config: JobConfig):
    key = (tuple(config.spec_paths), config.shipped, config.defaults)
    a = _ANALYZERS.get(key)
    if a is None:
        from kinspect.analysis.kernel import FlowAnalyzer

        a = _ANALYZERS[key] = FlowAnalyzer(config.registry())
    return a


def decode_batches(config: JobConfig) -> Callable:
    """The ``mapInArrow`` function decoding pairs into :data:`schema.DECODED` rows."""

    def run(batches):
        analyzer = _analyzer(config)
        for batch in batches:
            rows = [analyzer.flow_row(p) for p in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=schema.DECODED)

    return run


def what_if_batches(config: JobConfig, negative: frozenset[str]) -> Callable:
    """The ``mapInArrow`` function sizing messages into :data:`schema.WHAT_IF` rows."""

    def run(batches):
        from kinspect.codec.whatif import VarintSizer

        analyzer = _analyzer(config)
        key = (tuple(config.spec_paths), config.shipped, config.defaults, negative)
        sizer = _SIZERS.get(key)
        if sizer is None:
            sizer = _SIZERS[key] = VarintSizer(negative)
        for batch in batches:
            rows = []
            for p in batch.to_pylist():
                rows.extend(analyzer.what_if_rows(p, sizer))
            yield pa.RecordBatch.from_pylist(rows, schema=schema.WHAT_IF)

    return run


def spec_info(config: JobConfig) -> Callable:
    """A task function reporting which spec sources a worker loaded (for checks)."""

    def run(_):
        reg = config.registry()
        yield ([s.path for s in reg.sources], len(reg.messages), os.getpid())

    return run


# ---------------------------------------------------------------------------
# session and shipping


def build_session(master: str | None = "local[*]", *, app_name: str = "kinspect-analyze",
                  conf: dict[str, str] | None = None, python: str | None = None):
    """A SparkSession for the job.

    Args:
        master: master URL; ``None`` keeps what spark-submit configured.
        conf: extra Spark settings.
        python: the executors' Python (``spark.pyspark.python``); defaults to this
            interpreter for local masters (else the workers pick the system Python
            and miss pyarrow).
    """
    from pyspark.sql import SparkSession

    local = master is None or master.startswith("local")
    if python is None and local:
        python = sys.executable
    if python:
        os.environ.setdefault("PYSPARK_PYTHON", python)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name)
    if master is not None:
        b = b.master(master)
    settings = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if local:
        settings["spark.ui.enabled"] = "false"
        settings["spark.sql.shuffle.partitions"] = "8"
    if python:
        settings["spark.pyspark.python"] = python
    settings.update(conf or {})
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_session(spark: Any, timeout: float = 30.0) -> None:
    """Stop ``spark`` and the JVM this process launched for it, and wait for that JVM
    to exit: ``spark.stop()`` alone leaves the JVM running until this process exits
    (it ends when its stdin pipe closes), so a command would end with its JVM still
    alive, reparented to init. A JVM that does not exit within ``timeout`` seconds
    is killed. A gateway this process did not launch (``spark-submit`` runs the
    driver inside its JVM) is left alone. A later session launches a JVM of its own;
    a second call does nothing.
    """
    from pyspark import SparkContext

    if SparkContext._gateway is None:
        return  # stopped already (its JVM with it)
    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return
    with SparkContext._lock:
        SparkContext._gateway = None
        SparkContext._jvm = None
    try:
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - py4j's own clean-up: the JVM is ended below
        pass
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # (the JVM's signal to exit)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _zip_dir(src: Path, workdir: Path, stem: str, *, root: str = "",
             suffixes: tuple[str, ...] = ()) -> Path:
    """Zip ``src`` reproducibly (fixed timestamps, sorted) into ``workdir`` under a
    name carrying a hash of the content: Spark refuses to add two different files of
    one name to a context, and the same content may be shipped again."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file() and (not suffixes or p.suffix in suffixes) \
                    and "__pycache__" not in p.parts:
                info = zipfile.ZipInfo((Path(root) / p.relative_to(src)).as_posix(),
                                       date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, p.read_bytes())
    data = buf.getvalue()
    dest = workdir / f"{stem}-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    dest.write_bytes(data)
    return dest


def ship_code(spark, workdir: Path) -> Path:
    """Zip the ``kinspect`` package and add it to the job (``addPyFile``)."""
    pkg = Path(__file__).resolve().parents[1]
    dest = _zip_dir(pkg, workdir, "kinspect", root="kinspect", suffixes=(".py", ".json"))
    spark.sparkContext.addPyFile(str(dest))
    return dest


def ship_specs(spark, spec_paths: list[str], workdir: Path) -> JobConfig:
    """Zip each source of the driver's spec search path and add it with ``addFile``;
    return the config under which executors load exactly those."""
    from kinspect.codec.registry import search_path

    names = []
    for src in search_path(spec_paths):
        if src.kind == "dir":
            dest = _zip_dir(Path(src.path), workdir, "kinspect-specs", suffixes=(".json",))
        else:
            data = Path(src.path).read_bytes()
            dest = workdir / (f"kinspect-specs-{hashlib.sha256(data).hexdigest()[:16]}"
                              f"{Path(src.path).suffix or '.zip'}")
            dest.write_bytes(data)
        if dest.name not in names:
            spark.sparkContext.addFile(str(dest))
            names.append(dest.name)
    return JobConfig(spec_paths=names, shipped=True, defaults=False)


# ---------------------------------------------------------------------------
# progress


class SparkProgress:
    """Shows the job's steps and the running stage's tasks with rich, polling
    ``SparkContext.statusTracker()`` from a background thread.

    ``step(text)`` starts a step (also the Spark job description); use as a
    context manager. ``console=None`` disables output; on a console that is not a
    terminal (CI logs, pipes) each step is printed as a line instead.
    """

    def __init__(self, spark, steps: int, console: Any = None, interval: float = 0.25):
        self.sc = spark.sparkContext
        self.steps = steps
        self.console = console
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = None
        self._step_task = None
        self._stage_task = None
        self.stages_seen: set[int] = set()
        self._n = 0

    def __enter__(self) -> SparkProgress:
        if self.console is not None and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=self.console, transient=False)
            self._progress.start()
            self._step_task = self._progress.add_task("starting", total=self.steps)
            self._stage_task = self._progress.add_task("  tasks", total=1, visible=False)
        self._thread = threading.Thread(target=self._poll, name="kinspect-spark-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def step(self, text: str) -> None:
        self.sc.setJobDescription(text)
        self._n += 1
        if self._progress is None and self.console is not None:
            self.console.print(f"[{self._n}/{self.steps}] {text}", highlight=False)
        if self._progress is not None:
            task = self._progress.tasks[self._step_task]
            done = task.completed + (1 if task.description != "starting" else 0)
            self._progress.update(self._step_task, description=text, completed=done)

    def _poll(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.interval):
            try:
                ids = tracker.getActiveStageIds()
                total = done = 0
                for sid in ids:
                    self.stages_seen.add(sid)
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        total += info.numTasks
                        done += info.numCompletedTasks
            except Exception:  # noqa: BLE001 - the JVM may be shutting down
                return
            if self._progress is not None:
                if total:
                    self._progress.update(self._stage_task, total=total, completed=done,
                                          visible=True,
                                          description=f"  stage {','.join(map(str, ids))} tasks")
                else:
                    self._progress.update(self._stage_task, visible=False)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._progress is not None:
            self._progress.update(self._step_task, completed=self.steps, description="done")
            self._progress.update(self._stage_task, visible=False)
            self._progress.stop()
        self.sc.setJobDescription(None)


# ---------------------------------------------------------------------------
# the job


def _glob_escape(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped: ``spark.read`` expands globs,
    so a file named ``x[1].jsonl`` was an error and ``a*.jsonl`` read its siblings too."""
    return re.sub(r"([\\*?\[\]{}])", r"\\\1", path)


#: characters ``java.net.URI`` keeps as they are in a path (unreserved, punct, "@")
_URI_PATH_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                           "_-!.~'()*,;:$&+=@")


def _uri_name(name: str) -> str:
    """A file name as Spark gives it in ``_metadata.file_name`` (the path of a
    ``java.net.URI``): other ASCII characters than :data:`_URI_PATH_SAFE`, and
    space and control characters, %-escaped as UTF-8; other non-ASCII kept."""
    return "".join(
        c if c in _URI_PATH_SAFE or (not c.isascii() and c.isprintable() and not c.isspace())
        else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape"))
        for c in name)


#: (Java regex, replacement) passes making each lone-surrogate escape of a JSON line
#: (``\ud800`` not followed by a low one, ``\udc00`` not after a high one) U+FFFD,
#: which ``from_json`` would make "?" (Java's UTF-8 encoder); a pair is kept. The
#: first pass writes each escaped backslash (``\\``) as ``\u005c`` (the same
#: character), so that every backslash left starts an escape.
_SURROGATE_PASSES = (
    (r"\\\\", r"\\u005c"),
    (r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})", "\ufffd"),
    (r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}", "\ufffd"),
)
#: strict base64 text (``pybase64.b64decode(validate=True)``, with a length that is a
#: multiple of 4: :func:`kinspect.analysis.reference.bad_frame_key`)
_BASE64 = r"\A[A-Za-z0-9+/]*={0,2}\z"
#: what ``from_json`` makes of a JSON number or ``true`` read as a string, when
#: that could be base64 text too (a float has a ".", ``false`` 5 letters)
_MAYBE_NOT_STRING = r"\A(?:true|[0-9]+)\z"


def _valid_json_text(value):
    """The JSON line ``value`` (a string column) with each lone-surrogate escape
    replaced by U+FFFD (:data:`_SURROGATE_PASSES`), as
    :func:`kinspect.analysis.reference.valid_text` makes the parsed strings; only
    lines holding ``\\ud``/``\\uD`` are rewritten."""
    from pyspark.sql import functions as F

    fixed = value
    for pattern, replacement in _SURROGATE_PASSES:
        fixed = F.regexp_replace(fixed, pattern, replacement)
    return F.when(value.contains("\\ud") | value.contains("\\uD"), fixed).otherwise(value)


def _line_type(parsed, value):
    """A line's ``type``: as parsed, or ``"frame"`` when the line (an object) has no
    ``type`` key at all (not when it is ``null``), as capture.py's readers take it."""
    from pyspark.sql import functions as F

    typ = parsed["type"]
    no_key = typ.isNull() & ~F.array_contains(F.json_object_keys(value), "type")
    return F.when(no_key, F.lit("frame")).otherwise(typ)


def _not_base64(key: str):
    """Whether the frame line's ``key`` (``frame``, ``frame_sent``) is present and not
    base64 text (:func:`kinspect.analysis.reference.bad_frame_key`): a number or
    ``true``, which ``from_json`` reads as its text, is found by parsing the line
    again with that key as a number and as a boolean (only when the text could be
    base64)."""
    from pyspark.sql import functions as F

    c = F.col(f"r.{key}")
    typed = (F.from_json("value", f"{key} DOUBLE")[key].isNotNull()
             | F.from_json("value", f"{key} BOOLEAN")[key].isNotNull())
    text = c.rlike(_BASE64) & (F.length(c) % 4 == 0)
    string = ~F.when(c.rlike(_MAYBE_NOT_STRING), typed).otherwise(F.lit(False))
    return c.isNotNull() & ~(text & string)


def read_pairs(spark, captures: list[tuple[str, list[Path]]]):
    """DataFrame of :data:`schema.PAIR` rows from capture files.

    Raises:
        kinspect.capture.CaptureError: a local capture file Spark cannot read as
            named: gzip-compressed without a ``.gz`` suffix or the reverse (Spark
            picks the decompression by the suffix), a name holding ``:`` or a path
            that is not UTF-8 (Hadoop cannot open them); the first line, in file
            order, that the reference refuses too
            (:func:`kinspect.analysis.reference.read_frames`): not JSON (but a torn
            last line), an id that is no integer, a frame that is not base64, an id
            moved past 2**63-1 in an appended capture.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from kinspect.capture import CaptureError
    from kinspect.flows import CLOSED, NO_RESPONSE, UNPAIRED

    names = {}
    part_of = {}
    where = {}  # file name as Spark gives it -> the path the reference names in errors
    paths = []
    for name, parts in captures:
        for i, p in enumerate(parts):
            if isinstance(p, str):  # a URI
                paths.append(p)
                continue
            with open(p, "rb") as fh:
                magic = fh.read(2)
            if magic == b"\x1f\x8b" and not p.name.endswith(".gz"):
                raise CaptureError("gzip-compressed but not named *.gz: Spark picks "
                                   "the decompression by the file suffix", p)
            if magic and magic != b"\x1f\x8b" and p.name.endswith(".gz"):
                raise CaptureError("named *.gz but not gzip-compressed: Spark picks "
                                   "the decompression by the file suffix", p)
            if ":" in p.name:  # Hadoop's checksum file name for it is no valid path
                raise CaptureError("Spark (Hadoop) cannot read a file whose name holds "
                                   "':'; rename it", p)
            if valid_text(str(p)) != str(p):  # Java paths are text: no such name to open
                raise CaptureError("Spark (Hadoop) cannot read a file whose path is not "
                                   "UTF-8; rename it", valid_text(str(p)))
            key = _uri_name(p.name)  # file_name is the last segment of a URI: %-escaped
            part_of[key] = i
            names[key] = name
            where[key] = str(p)
            paths.append(_glob_escape(os.path.abspath(p)))
    raw = spark.read.text(paths).select("value", F.col("_metadata.file_name").alias("file"))
    raw = raw.withColumn("line", F.monotonically_increasing_id())
    # URIs (hdfs://, s3a://) go to Spark as they are: each file is its own capture
    capture = F.col("file")
    if names:
        mapping = F.create_map(*[F.lit(x) for kv in names.items() for x in kv])
        capture = F.coalesce(mapping[F.col("file")], F.col("file"))
    part = F.lit(0)
    if part_of:
        mapping = F.create_map(*[F.lit(x) for kv in part_of.items() for x in kv])
        part = F.coalesce(mapping[F.col("file")], F.lit(0))
    # a line that is not JSON, or holds a value of another type, keeps its text in
    # _corrupt (Spark gives its fields as nulls): _check_lines looks at those
    parsed = F.from_json(_valid_json_text(F.col("value")), LINE_DDL + ", _corrupt STRING",
                         {"columnNameOfCorruptRecord": "_corrupt"})
    lines = raw.select(parsed.alias("r"), "value", "file", "line", capture.alias("capture"),
                       part.alias("part_idx"))
    lines = lines.withColumn("typ", _line_type(F.col("r"), F.col("value")))
    order = {name: i for i, (name, _) in enumerate(captures)}
    sessions, errors = _check_lines(raw, lines, order)
    conn_base, flow_base, overflow = _segment_bases(lines, sessions, order)
    if errors or overflow:  # the first in file order, as the reference meets them
        _, reason, file, line = min(errors + overflow, key=lambda e: e[0])
        if line is None:
            raise CaptureError(reason, file)
        n = raw.where((F.col("file") == file) & (F.col("line") <= line)).count()
        raise CaptureError(reason, where.get(file, file), n)
    frames = (lines.where((F.col("typ") == "frame") & F.col("r.dir").isin("req", "resp"))
              .select("r.*", "capture", "line", "part_idx")
              .withColumn("conn", F.col("conn") + conn_base)
              .withColumn("flow", F.col("flow") + flow_base)
              .withColumn("correlation_id", F.coalesce("correlation_id", F.lit(-1))))
    # (definitions: reference.pair_frames) acks=0 Produce requests and responses the
    # proxy found unpaired are numbered apart, with negative numbers that match nothing
    empty = F.array().cast("array<string>")
    flags = F.coalesce(F.col("flags"), empty)
    solo = F.when(F.col("dir") == "req", F.array_contains(flags, NO_RESPONSE)) \
        .otherwise(F.array_contains(flags, UNPAIRED))
    frames = frames.withColumn("solo", solo)
    # line numbers go in file order within a file only (Spark packs a capture's parts
    # into partitions largest first): the part's index orders the parts, as the
    # reference's running line number does
    w = Window.partitionBy("capture", "conn", "dir", "correlation_id", "solo") \
        .orderBy("ts_ns", "part_idx", "line")
    n = F.row_number().over(w)
    frames = frames.withColumn(
        "seq", F.when(~F.col("solo"), n).when(F.col("dir") == "req", -2 * n).otherwise(1 - 2 * n))
    key = ["capture", "conn", "correlation_id", "seq"]
    req = frames.where(F.col("dir") == "req").select(
        *key, F.col("flow").alias("req_flow"), F.col("client").alias("req_client"),
        F.col("upstream").alias("req_upstream"), "api_key", "api_version",
        F.unbase64("frame").alias("req_frame"), F.col("ts_ns").alias("req_ns"),
        F.col("flags").alias("req_flags"))
    resp = frames.where(F.col("dir") == "resp").select(
        *key, F.col("flow").alias("resp_flow"), F.col("client").alias("resp_client"),
        F.col("upstream").alias("resp_upstream"),
        F.unbase64("frame").alias("resp_frame"), F.col("ts_ns").alias("resp_ns"),
        F.col("flags").alias("resp_flags"),
        F.length(F.unbase64("frame_sent")).cast("bigint").alias("resp_sent_bytes"))
    empty = F.array().cast("array<string>")
    pairs = req.join(resp, key, "full_outer").select(
        "capture", "conn", F.col("correlation_id").cast("int").alias("correlation_id"),
        F.col("seq").cast("int").alias("seq"),
        F.coalesce("req_flow", "resp_flow").alias("flow"),
        F.coalesce("req_client", "resp_client").alias("client"),
        F.coalesce("req_upstream", "resp_upstream").alias("upstream"),
        "api_key", "api_version", "req_frame", "resp_frame", "req_ns", "resp_ns",
        F.coalesce("req_flags", empty).alias("req_flags"),
        F.coalesce("resp_flags", empty).alias("resp_flags"),
        "resp_sent_bytes")
    # (reference.pair_frames) a request left without a response on a connection that
    # has a close line: closed
    closed = (lines.where((F.col("typ") == "conn") & (F.col("r.event") == "close"))
              .select(F.col("r.conn").alias("conn"), "capture", "line", "part_idx")
              .withColumn("conn", F.col("conn") + conn_base)
              .select("capture", "conn").distinct().withColumn("_closed", F.lit(True)))
    pairs = pairs.join(closed, ["capture", "conn"], "left")
    mark = (F.col("_closed") & F.col("req_frame").isNotNull() & F.col("resp_frame").isNull()
            & (F.col("seq") > 0) & ~F.array_contains("req_flags", CLOSED))
    pairs = pairs.withColumn("req_flags", F.when(
        F.coalesce(mark, F.lit(False)),
        F.concat("req_flags", F.array(F.lit(CLOSED)))).otherwise(F.col("req_flags")))
    return pairs.drop("_closed")


def _check_lines(raw, lines, order: dict[str, int]) -> tuple[list, list]:
    """Read the capture lines once on the executors for what the driver must know
    before pairing: return the session lines (few) it collected and the lines it
    cannot use, as ``[((capture order, part, line), reason, file, line)]`` (the
    line ``None`` when the reason names no line), for :func:`read_pairs` to raise
    the first of.

    As :func:`kinspect.capture.read_capture` (the reference's reader) does, a line
    that is not a JSON object is skipped with a :class:`CaptureWarning` when it is
    the last of its file (torn by a crash), and is an error anywhere else; so is a
    frame or conn line whose id is not an integer, and (as
    :func:`kinspect.analysis.reference.read_frames` has it) a frame line whose
    ``frame`` or ``frame_sent`` is not base64 (:func:`_not_base64`; a frame line
    without ``frame``, or with ``null``, too). Without this,
    such a line parsed to null and its frame was left out without a word.

    ``order``: capture name -> its place in the captures read.
    """
    import json
    import warnings

    from pyspark.sql import functions as F

    from kinspect.capture import CaptureWarning, _bad_value

    corrupt = F.col("r._corrupt").isNotNull() & (F.trim(F.col("value")) != "")
    typ = F.col("typ")
    not_json = corrupt & typ.isNull()
    bad_int = corrupt & typ.isin("frame", "conn")
    frame = ~corrupt & (typ == "frame")
    bad_frame = frame & (F.col("r.frame").isNull() | _not_base64("frame"))
    bad_sent = frame & _not_base64("frame_sent")
    marked = (lines.where((typ == "session") | not_json | bad_int | bad_frame | bad_sent)
              .select("capture", "part_idx", "line", "file", "typ", "r.start_ns", "r.part",
                      not_json.alias("not_json"), bad_int.alias("bad_int"),
                      bad_frame.alias("bad_frame"), bad_sent.alias("bad_sent"),
                      F.when(not_json | bad_int, F.col("value")).alias("value"))
              .collect())
    errors = []

    def error(r, reason: str, line: bool = True) -> None:
        errors.append(((order.get(r["capture"], len(order)), r["part_idx"], r["line"]),
                       reason, r["file"], r["line"] if line else None))

    for r in marked:
        if r["bad_int"]:
            try:
                rec = json.loads(r["value"])
            except ValueError:
                error(r, "a line other than the last is not a JSON object "
                      f"({r['value'][:60]!r}...)")
                continue
            why = _bad_value(rec) if isinstance(rec, dict) else None
            if why is None:  # e.g. a frame that is no string
                error(r, f"a value of the wrong type: {r['value'][:80]!r}", line=False)
            else:
                error(r, why)
        elif r["bad_frame"] or r["bad_sent"]:
            error(r, f"{'frame' if r['bad_frame'] else 'frame_sent'} is not base64")
    torn = [r for r in marked if r["not_json"]]
    if torn:
        files = sorted({r["file"] for r in torn})
        last = dict(raw.where(F.col("file").isin(files) & (F.trim(F.col("value")) != ""))
                    .groupBy("file").agg(F.max("line")).collect())
        for r in torn:
            if r["line"] != last[r["file"]]:
                error(r, "a line other than the last is not a JSON object "
                      f"({r['value'][:60]!r}...)")
            else:
                warnings.warn(f"{r['file']}: torn last line skipped ({len(r['value'])} chars)",
                              CaptureWarning, stacklevel=3)
    return [r for r in marked if r["typ"] == "session"], errors


def _segment_bases(lines, sessions: list, order: dict[str, int]):
    """``(conn_base, flow_base, overflow)``: the columns for the lines of
    :func:`read_pairs`, 0, or in a capture with captures appended to it (``cat
    a.jsonl b.jsonl``), for each one after the first, the ids to move its
    connections and flows past (the rule of
    :func:`kinspect.analysis.reference.read_frames`), computed on the driver from
    the ``sessions`` lines (:func:`_check_lines`); and ``overflow``, the first line
    of each capture whose ``conn`` or ``flow`` is moved past 2**63-1, in the shape
    of :func:`_check_lines`' errors (``[]`` for none: the columns are then ``None``).
    """
    from pyspark.sql import functions as F

    from kinspect.analysis.reference import MAX_ID, id_overflow, segment_bases, segment_starts

    zero = F.lit(0).cast("bigint")
    by_capture: dict[str, list] = {}
    for r in sorted(sessions, key=lambda r: (r["capture"], r["part_idx"], r["line"])):
        by_capture.setdefault(r["capture"], []).append(r)
    seg = zero
    segments: dict[str, int] = {}
    for cap, rows in by_capture.items():
        k = 0
        for r, new in zip(rows, segment_starts([(r["start_ns"], r["part"]) for r in rows]),
                          strict=True):
            if new:
                k += 1
                after = (F.col("part_idx") > r["part_idx"]) | (
                    (F.col("part_idx") == r["part_idx"]) & (F.col("line") >= r["line"]))
                seg = F.when((F.col("capture") == cap) & after, F.lit(k)).otherwise(seg)
        if k:
            segments[cap] = k + 1
    if not segments:
        return zero, zero, []
    is_frame = F.col("typ") == "frame"
    maxima = (lines.where(F.col("typ").isin("conn", "frame")
                          & F.col("capture").isin(list(segments)))
              .groupBy("capture", seg.alias("seg"))
              .agg(F.max("r.conn").alias("conn"),
                   F.max(F.when(is_frame, F.col("r.flow"))).alias("flow")).collect())
    got = {(r["capture"], r["seg"]): (r["conn"], r["flow"]) for r in maxima}
    conn_base = flow_base = zero
    overflow = []
    for cap, n in segments.items():
        maxes = [got.get((cap, k), (None, None)) for k in range(n)]
        bases = segment_bases(maxes)
        for k, ((cb, fb), (mc, mf)) in enumerate(zip(bases, maxes, strict=True)):
            if (mc is not None and mc + cb > MAX_ID) or (mf is not None and mf + fb > MAX_ID):
                # its first line past the range (the reference stops there)
                conn = F.col("r.conn") > MAX_ID - cb
                flow = is_frame & (F.col("r.flow") > MAX_ID - fb)
                r = (lines.where((F.col("capture") == cap) & (seg == k)
                                 & F.col("typ").isin("conn", "frame") & (conn | flow))
                     .select("part_idx", "line", "file", "r.conn", "r.flow",
                             F.coalesce(conn, F.lit(False)).alias("past"))
                     .orderBy("part_idx", "line").first())
                why = (id_overflow("conn", r["conn"], cb) if r["past"]
                       else id_overflow("flow", r["flow"], fb))
                overflow.append(((order.get(cap, len(order)), r["part_idx"], r["line"]), why,
                                 r["file"], r["line"]))
                break
            if k:
                here = (F.col("capture") == cap) & (seg == k)
                conn_base = F.when(here, F.lit(cb).cast("bigint")).otherwise(conn_base)
                flow_base = F.when(here, F.lit(fb).cast("bigint")).otherwise(flow_base)
    if overflow:
        return None, None, overflow
    return conn_base, flow_base, overflow


def _rank(col: str, p: int):
    from pyspark.sql import functions as F

    # nearest rank: element (p*n + 99) div 100 (1-based) of the sorted values
    return F.expr(f"CASE WHEN size({col}) > 0 THEN element_at({col}, "
                  f"CAST(({p} * size({col}) + 99) DIV 100 AS INT)) END")


def tables_from_decoded(decoded) -> dict[str, Any]:
    """The ``flows``, ``api_stats``, ``clients``, ``tagged_fields`` and ``topics``
    DataFrames from the decoded rows (definitions: :mod:`.reference`)."""
    from pyspark.sql import functions as F

    flow_cols = [n for n, _ in schema.FLOW_FIELDS]
    flows = decoded.select(*flow_cols)
    z = F.lit(0).cast("bigint")

    def s(c):
        return F.sum(F.coalesce(F.col(c).cast("bigint"), z)).cast("bigint")

    api = (flows.groupBy("api_key", "api_name", "api_version").agg(
        F.count(F.lit(1)).alias("count"),
        F.count("request_bytes").alias("requests"),
        F.count("response_bytes").alias("responses"),
        s("request_bytes").alias("request_bytes"),
        s("response_bytes").alias("response_bytes"),
        F.sum(F.when(F.coalesce("error_code", F.lit(0)) != 0, 1).otherwise(0))
        .cast("bigint").alias("errors"),
        F.count("decode_error").alias("undecoded"),
        F.sort_array(F.collect_list("latency_ns")).alias("_lat"))
        .withColumn("bytes", F.col("request_bytes") + F.col("response_bytes"))
        .withColumn("latency_count", F.size("_lat").cast("bigint")))
    for p in PERCENTILES:
        api = api.withColumn(f"latency_p{p}_ns", _rank("_lat", p))
    api = api.withColumn("latency_max_ns", F.expr("CASE WHEN size(_lat) > 0 THEN "
                                                  "element_at(_lat, -1) END"))
    api = api.select(*schema.API_STATS.names)

    sw = (flows.where(F.col("client_software_name").isNotNull()
                      | F.col("client_software_version").isNotNull())
          .groupBy("capture", "conn")
          .agg(F.min_by(F.struct("client_software_name", "client_software_version"),
                        F.struct("request_ns", "flow")).alias("sw")))
    fl = flows.drop("client_software_name", "client_software_version").join(
        sw, ["capture", "conn"], "left")
    clients = (fl.groupBy("client_id", F.col("sw.client_software_name").alias(
        "client_software_name"), F.col("sw.client_software_version").alias(
        "client_software_version")).agg(
        F.count_distinct("capture", "conn").cast("bigint").alias("connections"),
        F.count(F.lit(1)).alias("flows"),
        s("request_bytes").alias("request_bytes"),
        s("response_bytes").alias("response_bytes"),
        F.sort_array(F.collect_set("api_name")).alias("apis"))
        .select(*schema.CLIENTS.names))

    t = decoded.select("api_key", "api_name", "api_version", F.explode("tagged").alias("t"))
    tagged = (t.groupBy("api_key", "api_name", "api_version", "t.direction", "t.message",
                        "t.path", "t.tag", "t.name", "t.kind")
              .agg(F.sum("t.count").cast("bigint").alias("count"),
                   F.sum("t.data_bytes").cast("bigint").alias("data_bytes"),
                   F.sum("t.bytes").cast("bigint").alias("bytes"))
              .select(*schema.TAGGED_FIELDS.names))

    names = (decoded.select(F.explode("topic_names").alias("n"))
             .groupBy(F.col("n.topic_id").alias("tid")).agg(F.min("n.topic").alias("tname")))
    tp = decoded.select(F.explode("topics").alias("t")).select("t.*")
    tp = (tp.join(names, tp.topic_id == names.tid, "left")
          .withColumn("topic", F.coalesce("topic", "tname", "topic_id")))
    prod = F.col("direction") == "produce"

    def side(cond, c):
        return F.sum(F.when(cond, F.col(c)).otherwise(0)).cast("bigint")

    topics = (tp.groupBy("topic", "partition", "codec").agg(
        side(prod, "batches").alias("produced_batches"),
        side(prod, "records").alias("produced_records"),
        side(prod, "bytes").alias("produced_bytes"),
        side(~prod, "batches").alias("fetched_batches"),
        side(~prod, "records").alias("fetched_records"),
        side(~prod, "bytes").alias("fetched_bytes"),
        F.sum("payload_bytes").cast("bigint").alias("payload_bytes"),
        F.sum("uncompressed_bytes").cast("bigint").alias("uncompressed_bytes"))
        .withColumn("compression_ratio",
                    F.when(F.col("payload_bytes") > 0,
                           F.col("uncompressed_bytes").cast("double")
                           / F.col("payload_bytes").cast("double")))
        .select(*schema.TOPICS.names))
    return {"flows": flows, "api_stats": api, "clients": clients, "tagged_fields": tagged,
            "topics": topics}


def what_if_summary_df(what_if):
    """Per (api, direction): messages, bytes, and per variant the bytes over the
    messages it can represent (``<v>_bytes``) against their wire bytes
    (``<v>_base``)."""
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).alias("messages"), F.sum("bytes").cast("bigint").alias("bytes")]
    for v in schema.VARIANTS:
        c = F.col(f"{v}_bytes")
        aggs += [F.count(c).alias(f"{v}_messages"), F.sum(c).cast("bigint").alias(f"{v}_bytes"),
                 F.sum(F.when(c.isNotNull(), F.col("bytes"))).cast("bigint").alias(f"{v}_base")]
    return what_if.groupBy("api_key", "api_name", "direction").agg(*aggs)


def latency_hist_df(flows):
    """Latency histogram per api: 4 log-spaced buckets per decade of nanoseconds
    (bucket ``b`` holds latencies in ``[10**(b/4), 10**((b+1)/4))``)."""
    from pyspark.sql import functions as F

    return (flows.where(F.col("latency_ns").isNotNull())
            .select("api_name", F.floor(F.log10(F.greatest("latency_ns", F.lit(1))) * 4)
                    .cast("int").alias("bucket"))
            .groupBy("api_name", "bucket").agg(F.count(F.lit(1)).alias("count")))


def _rows(df) -> list[dict]:
    return [r.asDict(recursive=True) for r in df.collect()]


def run_job(spark, capture_paths: list[str], out: str | os.PathLike, *,
            spec_paths: list[str] = (), ship: bool = True, code: bool | None = None,
            what_if: bool = True, console: Any = None,
            partitions: int | None = None) -> AnalysisResult:
    """Run the analysis on ``spark`` and write the tables under ``out``.

    Args:
        capture_paths: capture files or directories (local paths the driver can
            list; on a cluster, paths every executor can read too).
        spec_paths: spec sources searched first (``--specs``).
        ship: ship the driver's spec sources to the executors (see the module
            docstring); else pass ``spec_paths`` as they are.
        code: ship the kinspect package (``None``: when the master is not local).
        what_if: compute the ``what_if`` table.
        console: a rich Console for progress, or ``None``.
        partitions: partitions of the decoding stages (default: 4 per core).

    Raises:
        kinspect.capture.CaptureError: a missing capture path, or a capture file
            Spark cannot read as named (see :func:`read_pairs`).
        OSError: a local ``out`` that cannot be made a directory.
    """
    t0 = time.perf_counter()
    out = str(out).rstrip("/") or "/"
    captures = capture_files(capture_paths)
    made: list[Path] = []  # the directories made for out, deepest first
    if "://" not in out:  # fail now, not after decoding, when it cannot be a directory
        for d in (Path(out), *Path(out).parents):
            if d.exists():
                break
            made.append(d)
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), out) from None
    try:
        return _run_job(spark, captures, out, spec_paths, ship, code, what_if, console,
                        partitions, t0)
    except BaseException:
        for d in made:  # what a run that failed (a bad capture line) left empty goes
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _run_job(spark, captures, out: str, spec_paths, ship: bool, code: bool | None,
             what_if: bool, console, partitions: int | None, t0: float) -> AnalysisResult:
    """:func:`run_job` once ``out`` is a directory."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    def at(name: str) -> str:  # a local path or a URI (hdfs://, s3a://...)
        return f"{out}/{name}"

    master = spark.sparkContext.master
    workdir = Path(tempfile.mkdtemp(prefix="kinspect-job-"))
    # the driver serves added files from here while the context lives
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    if code or (code is None and not master.startswith("local")):
        ship_code(spark, workdir)
    config = ship_specs(spark, list(spec_paths), workdir) if ship else \
        JobConfig(spec_paths=list(spec_paths), shipped=False, defaults=True)

    steps = 8 if what_if else 6
    counts: dict[str, int] = {}
    with SparkProgress(spark, steps, console) as prog:
        prog.step("reading and pairing frames")
        # an explicit count (which adaptive execution keeps) so that the Python
        # decoding, the expensive part, spreads over every core
        n = partitions or spark.sparkContext.defaultParallelism * 4
        pairs = read_pairs(spark, captures).repartition(n).persist(StorageLevel.MEMORY_AND_DISK)
        decoded = pairs.mapInArrow(decode_batches(config), from_arrow_schema(schema.DECODED))
        decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        tables = tables_from_decoded(decoded)
        prog.step("decoding on the executors, writing flows")
        tables["flows"].write.mode("overwrite").parquet(at("flows"))
        small: dict[str, list[dict]] = {}
        for name in ("api_stats", "clients", "tagged_fields", "topics"):
            prog.step(f"writing {name}")
            df = tables[name].orderBy(*schema.SORT_KEYS[name]).coalesce(1).persist()
            df.write.mode("overwrite").parquet(at(name))
            small[name] = _rows(df)
            df.unpersist()
            counts[name] = len(small[name])
        counts["flows"] = sum(r["count"] for r in small["api_stats"])
        frames = sum(r["requests"] + r["responses"] for r in small["api_stats"])
        hist = _rows(latency_hist_df(tables["flows"]))
        summary: list[dict] = []
        if what_if:
            prog.step("what-if: fields seen negative")
            negative = frozenset(r[0] for r in decoded.select(
                F.explode("negative_fields")).distinct().collect())
            prog.step("what-if sizes on the executors")
            wi = pairs.mapInArrow(what_if_batches(config, negative),
                                  from_arrow_schema(schema.WHAT_IF))
            wi.write.mode("overwrite").parquet(at("what_if"))
            summary = _rows(what_if_summary_df(spark.read.parquet(at("what_if"))))
            counts["what_if"] = sum(r["messages"] for r in summary)
        decoded.unpersist()
        pairs.unpersist()
    return AnalysisResult(engine=f"spark {master}", out=Path(out) if "://" not in out else out,
                          tables={n: counts[n] for n in schema.TABLES if n in counts},
                          api_stats=small["api_stats"], clients=small["clients"],
                          topics=small["topics"], tagged=small["tagged_fields"],
                          what_if_summary=summary, latency_hist=hist, frames=int(frames),
                          seconds=time.perf_counter() - t0, spec_sources=config.spec_paths)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m kinspect.analysis.job`` and spark-submit (the
    master comes from spark-submit unless ``--master`` is given)."""
    import argparse

    from kinspect.commands.analyze import add_arguments, run

    p = argparse.ArgumentParser(prog="kinspect-analyze-job",
                                description="kinspect capture analysis (PySpark job)")
    add_arguments(p, master_default=None)
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":  # spark-submit kinspect/analysis/job.py ...
    sys.exit(main())
