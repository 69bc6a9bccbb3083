"""The README's job on the lab, submitted from the driver host with docs/operations.md's spark-submit
command to the two worker hosts through spark://spark-master:7077, exact against a replication-3 topic.

The README's set-up (its shell block's owner lines and setup_wordcount.py) and the cluster section's
``myjobs/wordcount.py`` and ``job.py`` run as printed but for their names (topic ``sentences``, job
``word-count``, schema ``wordcount`` get a suffix per run, so both runs start empty on one lab). On
top of the README's three sentences a transactional producer commits 400 more in two transactions
and aborts 100. The argv is :func:`~txn_offsets.devstack.lab.submit.spark_submit_argv`'s with only
the lab's settings added (the driver's address; executor memory and cores that fit the 640m/1-core
workers) and ``spark.python.worker.reuse`` on or off (issue 45, item 5). The tasks report the host
they ran on and where they imported txn_offsets from.

Measured 2026-11-28 on the shared 2-core machine (load 9-12), on a running lab: worker reuse on,
spark-submit 106 s, the test 116 s; off, 131 s and 147 s. A lab brought up for the module adds
its 80 s: marked ``lab`` (``make test-lab``).
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.spark.test_readme import SENTENCES, UNCONFINED, readme_blocks
from tests.lab.conftest import CHECKOUT, RunningLab
from tests.unit.test_docs_submit import OPERATIONS, marked_block
from txn_offsets.devstack.lab import kafka3, spark
from txn_offsets.devstack.lab.spawn import entered, run_in
from txn_offsets.devstack.lab.submit import Submission, spark_submit_argv

pytestmark = pytest.mark.lab

VENV_BIN = Path(sys.executable).parent
ARCHIVE = CHECKOUT / "dist" / "job-env.tar.gz"
COMMITTED, ABORTED = 400, 100
#: appended to the documented job.py: each task's host address (the source address towards the
#: master), interpreter, txn_offsets and working directory
PROBE = """
import json as _json
def _where(_):
    import os, socket, sys, psycopg, txn_offsets
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("spark-master", 7077))
    yield _json.dumps({"host": s.getsockname()[0], "python": os.path.realpath(sys.executable),
                       "txn_offsets": txn_offsets.__file__, "psycopg": psycopg.__file__, "cwd": os.getcwd()})
print("PROBE", _json.dumps(spark.sparkContext.parallelize(range(8), 8).mapPartitions(_where).collect()))
"""
PRODUCE = """
import os, sys
from confluent_kafka import Producer
topic, committed, aborted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
servers = os.environ["TXN_OFFSETS_KAFKA_BOOTSTRAP"]
p = Producer({"bootstrap.servers": servers, "transactional.id": "lab-" + topic})
p.init_transactions(60)
for lo, hi, commit in ((0, committed // 2, True), (committed // 2, committed // 2 + aborted, False),
                       (committed // 2 + aborted, committed + aborted, True)):
    p.begin_transaction()
    for i in range(lo, hi):
        p.produce(topic, (f"lab w{i % 7} x{i % 3}" if commit else f"aborted w{i}").encode())
    p.flush(60)
    p.commit_transaction(60) if commit else p.abort_transaction(60)
"""


def renamed(text: str, tag: str) -> str:
    """The README's names with a suffix (`tag`): topic, job, schema."""
    return (
        text.replace('"sentences"', f'"sentences_{tag}"')
        .replace('"word-count"', f'"word-count-{tag}"')
        .replace('schema="wordcount"', f'schema="wordcount_{tag}"')
        .replace("EXISTS wordcount", f"EXISTS wordcount_{tag}")
        .replace("wordcount.word_counts", f"wordcount_{tag}.word_counts")
    )


def expected_words() -> collections.Counter[str]:
    words = collections.Counter(w for s in SENTENCES for w in s.split())
    for i in [*range(COMMITTED // 2), *range(COMMITTED // 2 + ABORTED, COMMITTED + ABORTED)]:
        words.update(f"lab w{i % 7} x{i % 3}".split())
    return words


@pytest.mark.parametrize("reuse", [True, False], ids=["worker-reuse", "no-worker-reuse"])
def test_the_readme_job_runs_exact_on_the_lab_workers(
    running_lab: RunningLab, tmp_path: Path, reuse: bool
) -> None:
    t_test = time.monotonic()
    assert ARCHIVE.is_file(), f"{ARCHIVE} is missing: run `make job-env`"
    lab, net = running_lab.lab, running_lab.lab.net
    tag = f"{'reuse' if reuse else 'noreuse'}_{int(time.time()) % 100000}"
    root = tmp_path / "wordcount"
    (root / "myjobs").mkdir(parents=True)
    blocks = {marker: code for marker, _, code in readme_blocks()}
    (root / "setup_wordcount.py").write_text(renamed(blocks["usage-file setup_wordcount.py"], tag))
    (root / "myjobs" / "__init__.py").write_text("")
    (root / "myjobs" / "wordcount.py").write_text(
        renamed(marked_block(OPERATIONS, "cluster-file myjobs/wordcount.py"), tag)
    )
    (root / "job.py").write_text(renamed(marked_block(OPERATIONS, "cluster-file job.py"), tag) + PROBE)
    (root / "job-env.tar.gz").symlink_to(ARCHIVE)
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        **running_lab.env,
        "SPARK_LOCAL_IP": net.host("driver").address,
    }

    # the README's owner lines (the stack is the lab: no `dev up`, its env is the lab's)
    owner = [ln for ln in blocks["usage-shell"].splitlines() if ln.startswith("TXN_OFFSETS_DATABASE_URL=$")]
    assert len(owner) == 3, blocks["usage-shell"]
    script = "set -euo pipefail\n" + renamed("\n".join(owner), tag)
    (zip_line,) = [ln for ln in marked_block(OPERATIONS, "cluster-submit").splitlines() if "zipfile" in ln]
    setup = run_in(net, "driver", ["bash", "-c", f"{script}\n{zip_line}"], env=env, cwd=root, timeout_s=300)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
    produced = run_in(net, "driver", [sys.executable, "-c", PRODUCE, f"sentences_{tag}", str(COMMITTED),
                                      str(ABORTED)], env=env, timeout_s=300)  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-3000:]

    conf = {
        "spark.driver.host": net.host("driver").address,
        "spark.executor.memory": "512m",  # the workers offer 640m
        "spark.cores.max": "2",
        "spark.python.worker.reuse": str(reuse).lower(),
    }
    sub = Submission(master=spark.master_url(net), job="job.py", archive="job-env.tar.gz",
                     driver_python=sys.executable, py_files=("myjobs.zip",), conf=conf)  # fmt: skip
    argv = spark_submit_argv(sub, spark_submit=str(VENV_BIN / "spark-submit"))
    started = time.monotonic()
    done = run_in(net, "driver", argv, env=env, cwd=root, timeout_s=900)
    submit_s = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert UNCONFINED not in done.stderr, done.stderr[-3000:]
    out = done.stdout.splitlines()
    records = len(SENTENCES) + COMMITTED
    assert any(re.fullmatch(rf"{records} records counted exactly once in \d+ batches", ln) for ln in out), out

    # the tasks ran on both worker hosts, on the nodes' Python, txn_offsets from the unpacked env
    (probe,) = [json.loads(ln.removeprefix("PROBE ")) for ln in out if ln.startswith("PROBE ")]
    tasks = [json.loads(t) for t in probe]
    assert {t["host"] for t in tasks} == {"10.47.45.32", "10.47.45.33"}, tasks
    for task in tasks:
        worker = "worker-1" if task["host"].endswith(".32") else "worker-2"
        assert re.fullmatch(rf"{lab.run_dir}/{worker}/work/app-[^/]+/\d+", task["cwd"]), task
        site = f"{task['cwd']}/env/lib/python3.{sys.version_info[1]}/site-packages"
        for module in ("txn_offsets", "psycopg"):
            assert task[module] == f"{site}/{module}/__init__.py", task
        assert task["python"] == os.path.realpath(running_lab.env["LAB_NODE_PYTHON"]), task

    # exact: the table's counts, and the stored offsets and lineage at Kafka's ends
    owner_url = running_lab.env["TXN_OFFSETS_OWNER_DATABASE_URL"].replace(
        "@pg-1:", f"@{net.host('pg-1').address}:"
    )
    with entered(net, "driver"):  # this process has no /etc/hosts of the lab's: addresses
        ends = _high_watermarks(kafka3.bootstrap(net, by_name=False), f"sentences_{tag}")
        engine = sa.create_engine(owner_url)
        try:
            with engine.connect() as conn:
                words: dict[str, int] = dict(
                    conn.execute(sa.text(f"SELECT word, n FROM wordcount_{tag}.word_counts")).all()
                )
                job = {"job": f"word-count-{tag}"}
                offsets: dict[int, int] = dict(conn.execute(sa.text(
                    "SELECT part, off FROM txn_offsets.offsets WHERE job = :job"), job).all())  # fmt: skip
                lineage = conn.execute(sa.text(
                    "SELECT part, from_off, until_off FROM txn_offsets.commits WHERE job = :job "
                    "ORDER BY part, from_off"), job).all()  # fmt: skip
        finally:
            engine.dispose()
    assert words == dict(expected_words())
    assert sum(ends.values()) >= records + ABORTED  # plus the transactions' markers
    assert offsets == ends
    for part, end in ends.items():
        ranges = [(lo, hi) for p, lo, hi in lineage if p == part]
        if end == 0:  # nothing was ever produced there: nothing to commit
            assert ranges == [], ranges
            continue
        assert [lo for lo, _ in ranges] == [0, *[hi for _, hi in ranges[:-1]]], ranges
        assert ranges[-1][1] == end, ranges
    print(f"\nlab README job, worker reuse {reuse}: spark-submit {submit_s:.0f} s, the test "
          f"{time.monotonic() - t_test:.0f} s (lab up here: {running_lab.up_seconds:.0f} s); "
          f"{records} records, offsets {offsets}, tasks on {sorted({t['host'] for t in tasks})}")  # fmt: skip


def _high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{topic}",
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        assert all(len(p.replicas) == 3 for p in parts.values()), parts
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
    finally:
        consumer.close()
