"""Capture analysis: ``kinspect analyze`` as a PySpark job, plus the same
computation in one process.

Modules:

* :mod:`~kinspect.analysis.job` - the Spark job (``run_job``, ``build_session``;
  runnable with ``spark-submit kinspect/analysis/job.py``);
* :mod:`~kinspect.analysis.reference` - the single-process computation and the
  shared definitions (pairing, percentiles, clients, topics);
* :mod:`~kinspect.analysis.kernel` - per-flow decoding used by both (runs on the
  Spark executors);
* :mod:`~kinspect.analysis.schema` - the Parquet tables' columns;
* :mod:`~kinspect.analysis.summary` / :mod:`~kinspect.analysis.report` - the rich
  summary and the one-page HTML report (matplotlib);
* :mod:`~kinspect.analysis.sample` - records a real capture (kafka-python through
  the proxy to Tansu) for tests and benchmarks.

Needs the ``analysis`` extra (pyspark, pyarrow, pandas, matplotlib); the Spark job
also needs Java 17+.
"""
