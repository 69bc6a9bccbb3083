"""docs/operations.md's spark-submit command is what txn_offsets.devstack.lab.submit renders, word for
word; its job is the README's; and the error a missing module gives names the spark-submit flag."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txn_offsets.devstack.lab.submit import DOCUMENTED, shell_command, spark_submit_argv
from txn_offsets.errors import ConfigError
from txn_offsets.spark.frames import worker_imports

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = (REPO / "docs" / "operations.md").read_text()


def marked_block(text: str, marker: str) -> str:
    found = re.findall(rf"<!-- {re.escape(marker)}[:\s][^>]*-->\s*```\w+\n(.*?)```", text, re.DOTALL)
    assert len(found) == 1, f"one block marked {marker!r} expected, found {len(found)}"
    return str(found[0])


def test_the_documented_command_is_the_rendered_one() -> None:
    block = marked_block(OPERATIONS, "cluster-submit")
    command = block[block.index("spark-submit ") :].rstrip("\n")
    assert command == shell_command(spark_submit_argv(DOCUMENTED))


def as_bash_reads(command: str) -> list[str]:
    """The words bash passes to the command's program (``spark-submit`` stood in for by a function)."""
    script = 'spark-submit() { printf "%s\\0" "$@"; }; which() { echo /venv/bin/python; }\n' + command
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.split("\0")[:-1]


def test_the_documented_command_ships_the_env_the_modules_and_both_pythons() -> None:
    assert as_bash_reads(shell_command(spark_submit_argv(DOCUMENTED))) == [
        "--master", "spark://spark-master:7077",
        "--archives", "job-env.tar.gz#env",
        "--conf", "spark.pyspark.python=./env/bin/python",
        "--conf", "spark.pyspark.driver.python=/venv/bin/python",
        "--conf", "spark.python.unix.domain.socket.enabled=true",
        "--py-files", "myjobs.zip",
        "job.py",
    ]  # fmt: skip


def test_the_cluster_job_is_the_readmes() -> None:
    """The module the executors import holds the README job's table, functions and writer as printed."""
    readme = (REPO / "README.md").read_text()
    job = marked_block(readme, "usage-file wordcount.py")
    start, end = job.index("word_counts = "), job.index("\nsummary = ")
    module = marked_block(OPERATIONS, "cluster-file myjobs/wordcount.py")
    assert job[start:end].strip() in module
    driver = marked_block(OPERATIONS, "cluster-file job.py")
    assert "from myjobs.wordcount import writer" in driver
    assert "local_session" not in driver  # it would run Spark in the driver, bound to 127.0.0.1


WORDS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)  # a bash each
@given(master=WORDS, job=WORDS, archive=WORDS, python=WORDS, py_files=st.lists(WORDS, max_size=2))
def test_the_rendered_command_reads_back_as_the_argv(
    master: str, job: str, archive: str, python: str, py_files: list[str]
) -> None:
    sub = dataclasses.replace(
        DOCUMENTED, master=master, job=job, archive=archive, driver_python=python, py_files=tuple(py_files)
    )
    argv = spark_submit_argv(sub)
    rendered = shell_command(argv)
    if '"$(' not in rendered:  # a documented expansion is the shell's to run
        assert as_bash_reads(rendered) == argv[1:]


def test_a_missing_module_names_the_spark_submit_flag() -> None:
    with pytest.raises(ConfigError) as raised, worker_imports():
        raise RuntimeError("Python worker failed: ModuleNotFoundError: No module named 'myjobs'")
    message = str(raised.value)
    assert "cannot import module 'myjobs'" in message
    assert "spark-submit --py-files" in message
    assert "--archives job-env.tar.gz#env" in message
