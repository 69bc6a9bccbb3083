"""A class-data archive (JDK's AppCDS) for the Spark JVMs the tests start.

Each Spark JVM the suite starts - a local session in a job's subprocess, a Connect server, the
standalone cluster's master and workers - loads and verifies the same ~10,000 classes of pyspark's
jars: measured 2026-11-29 on the 2-core machine, a local[2] session that runs one job took 14-16 s of
CPU, 9-12 s with the classes mapped from an archive (``-XX:SharedArchiveFile``). :func:`archive`
names the archive for this pyspark and this ``java`` (kept in ``~/.cache/txn-offsets/cds``);
:func:`build` dumps it from one small session (``-XX:ArchiveClassesAtExit``: ~50 s and ~55 s of CPU,
written under another name and renamed when complete): ``make test`` runs it (``python -m
tests.jvm_archive``) beside lint and the stack's start when the archive is missing, and
tests/conftest.py hands every JVM of the run the archive that exists (:func:`options`).

The JVM validates an archive itself (its JVM build and class path must match; a JVM started before
the archive exists, or with another class path - the Kafka brokers, the README's own virtualenv -
runs without it) and says so only in its ``cds`` log, which :data:`OPTIONS` turns off. Nothing of a
result depends on it: the same classes, loaded from a memory map instead of the jars.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
from pathlib import Path

__all__ = ["OPTIONS", "archive", "build", "options"]

#: the JVM's own messages about the archive (found, not found, another class path): off
OPTIONS = "-Xlog:cds=off,cds+dynamic=off"


def archive() -> Path | None:
    """Where this pyspark's and this java's archive is (or will be); None without a java."""
    java = shutil.which("java")
    if java is None:
        return None
    import pyspark

    key = f"{pyspark.__version__}|{os.path.realpath(java)}|{Path(pyspark.__file__).parent}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "txn-offsets" / "cds" / f"spark-{pyspark.__version__}-{digest}.jsa"


def build(path: Path, jvm_options: str) -> None:
    """Dump the archive from one small local session (an RDD job and a DataFrame query), under a
    lock: one builder at a time; the archive renamed into place once the JVM wrote it whole."""
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another process builds it
        if path.exists():
            return
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        os.environ["JAVA_TOOL_OPTIONS"] = f"{jvm_options} -XX:ArchiveClassesAtExit={partial} {OPTIONS}"
        from txn_offsets import local_session

        spark = local_session("jvm-archive", master="local[2]")
        spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).count()
        spark.range(0, 100, 1, 2).selectExpr("id % 7 AS k").groupBy("k").count().collect()
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        spark.stop()
        proc = gateway.proc  # type: ignore[union-attr]
        proc.stdin.close()  # the gateway JVM exits at EOF on its stdin, writing the archive
        proc.wait(300)
        if partial.exists():
            os.replace(partial, path)


def options() -> str:
    """The JVM options that use the archive, if it exists (else none: a JVM told of a missing
    archive runs without the JDK's own one too)."""
    path = archive()
    return f"-XX:SharedArchiveFile={path} {OPTIONS}" if path is not None and path.exists() else ""


def main() -> int:
    from tests.conftest import TEST_JVM_OPTIONS

    path = archive()
    if path is None:
        print("jvm archive: no java on PATH")
        return 0
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build(path, TEST_JVM_OPTIONS)
    print(f"jvm archive: {path}" if path.exists() else "jvm archive: not built (another process builds it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
