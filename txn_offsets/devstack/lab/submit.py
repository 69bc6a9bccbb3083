"""The spark-submit command that runs a job on a cluster with the packed job environment: one function
renders it, docs/operations.md prints it (compared word for word by tests/unit/test_docs_submit.py) and
the tests and the lab run it.

Executors unpack ``--archives job-env.tar.gz#env`` into ``./env`` and run its ``bin/python``
(``spark.pyspark.python``): txn_offsets and its native dependencies come from there (:mod:`.jobenv`),
pyspark from the cluster's SPARK_HOME. The job's own modules travel with ``--py-files`` (a ``.py`` or a
``.zip`` of a package: task functions are pickled by reference to their modules). The driver runs in
the submitting machine's virtualenv (``spark.pyspark.driver.python``): ``./env`` exists only on the
executors.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["DOCUMENTED", "Submission", "shell_command", "spark_submit_argv"]


@dataclass(frozen=True)
class Submission:
    """What differs between two submissions: the cluster, the archive, the job and its modules."""

    master: str  # spark://host:7077
    job: str  # the driver program
    archive: str  # the packed job environment (make job-env)
    driver_python: str  # the submitting virtualenv's python (txn_offsets + pyspark)
    py_files: tuple[str, ...] = ()  # the job's own modules
    conf: Mapping[str, str] = field(default_factory=dict)  # further settings (the lab's addresses)


#: the values docs/operations.md shows (the lab's host names; `"$(which python)"` is expanded by the shell)
DOCUMENTED = Submission(
    master="spark://spark-master:7077",
    job="job.py",
    archive="job-env.tar.gz",
    driver_python='"$(which python)"',
    py_files=("myjobs.zip",),
)


def spark_submit_argv(sub: Submission, spark_submit: str = "spark-submit") -> list[str]:
    """The command line, as a list (no shell: `driver_python` is used as given)."""
    argv = [spark_submit, "--master", sub.master]
    argv += ["--archives", f"{sub.archive}#env"]
    argv += ["--conf", "spark.pyspark.python=./env/bin/python"]
    argv += ["--conf", f"spark.pyspark.driver.python={sub.driver_python}"]
    # Python workers reach their executor over a Unix socket (Spark >= 4.1; docs/operations.md)
    argv += ["--conf", "spark.python.unix.domain.socket.enabled=true"]
    if sub.py_files:
        argv += ["--py-files", ",".join(sub.py_files)]
    for key, value in sub.conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, sub.job]


_PLAIN = re.compile(r"[\w@%+=:,./-][\w@%+=:,./#-]*")
_EXPANSION = re.compile(r'[\w.=-]*"\$\([^"`\\]*\)"')  # name="$(command)": left for the shell


def _word(word: str) -> str:
    return word if _PLAIN.fullmatch(word) or _EXPANSION.fullmatch(word) else shlex.quote(word)


def shell_command(argv: Sequence[str]) -> str:
    """`argv` for a shell, one option and its value a line (the first line: the program and
    --master), the job last."""
    words = [_word(w) for w in argv]
    lines = [" ".join(words[:3])]
    i = 3
    while i < len(words) - 1:
        step = 2 if words[i].startswith("--") and i + 1 < len(words) - 1 else 1
        lines.append("  " + " ".join(words[i : i + step]))
        i += step
    lines.append("  " + words[-1])
    return " \\\n".join(lines)
