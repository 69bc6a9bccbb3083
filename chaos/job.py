"""The job under test, in its own process: count page views per user with ``run_job``.

    python -m chaos.job --job J --topics T --schema S [--faults JSON] [--follow] ...

The database URL is read from the environment variable named by ``--database-url-env`` (default
TXN_OFFSETS_DATABASE_URL), never from the command line, so a bad-configuration run (F11) cannot
leak a password through ``ps``. The Spark session starts only when the first batch needs it: a
run that fails on its configuration fails in about a second, without a JVM.

Exit codes: 0 done (caught up, or stopped by SIGTERM), 1 a txn_offsets error (one line on stderr,
``chaos-job: <ErrorType>: <message>``), 2 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from chaos.faults import AfterCommit, CountUsers, CountWrite, FaultPlan, decode_user
from txn_offsets import JobSummary, LowLatency, run_job
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka.start import StartPolicy
from txn_offsets.plan.planner import Limits
from txn_offsets.redaction import Secret
from txn_offsets.spark import runner
from txn_offsets.spark.many import run_jobs
from txn_offsets.spark.summary import BatchReport
from txn_offsets.spark.tasks import ReadOptions
from txn_offsets.spark.writers import PartitionWriter

logger = logging.getLogger("chaos.job")
SPARK_STARTING = "starting the Spark session"  # F11: a bad configuration fails before this line


class LazySpark:
    """Stands in for the SparkSession and starts it on first use (run_job only touches it to run
    a batch). Its context's ``defaultParallelism`` (the connection budget's slots, checked before
    the run starts) is answered from a ``local[N]`` master without starting the JVM."""

    def __init__(self, app: str, master: str, conf: dict[str, str]) -> None:
        self._args = (app, master, conf)
        self.session: Any = None
        threads = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
        if threads:  # else sparkContext starts the session like any other attribute
            self.sparkContext = _LazyContext(self, int(threads.group(1)))

    def started(self) -> Any:
        if self.session is None:
            from txn_offsets.spark.session import local_session

            app, master, conf = self._args
            logger.info(SPARK_STARTING)
            self.session = local_session(app, master=master, conf=conf)
            self.sparkContext = self.session.sparkContext
        return self.session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.started(), name)


class _LazyContext:
    """The session's SparkContext until the session starts: its local thread count as the default
    parallelism (what Spark answers for ``local[N]``); anything else starts the session."""

    def __init__(self, owner: LazySpark, threads: int) -> None:
        self._owner = owner
        self.defaultParallelism = threads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.started().sparkContext, name)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos.job", description=__doc__.splitlines()[0])
    p.add_argument("--job", required=True)
    p.add_argument("--topics", required=True, help="comma-separated topics")
    p.add_argument("--schema", required=True, help="Postgres schema of the offsets and result tables")
    p.add_argument("--kafka-bootstrap", default=os.environ.get("TXN_OFFSETS_KAFKA_BOOTSTRAP", ""))
    p.add_argument("--database-url-env", default="TXN_OFFSETS_DATABASE_URL")
    p.add_argument("--app-name", default="chaos-job", help="application_name of the job's connections")
    p.add_argument("--master", default="local[2,3]", help="local[2,3]: 2 threads, 3 attempts per task")
    p.add_argument("--max-per-partition", type=int, default=2_000)
    p.add_argument("--max-per-batch", type=int, default=0, help="a cap on each batch in all (0: none)")
    p.add_argument(
        "--max-tasks",
        type=int,
        default=0,
        help="F2: ReadOptions(max_tasks=...), Spark tasks per batch (0: the library's, one per core)",
    )
    p.add_argument("--follow", action="store_true", help="run until SIGTERM instead of until caught up")
    p.add_argument("--batch-interval", type=float, default=0.5)
    p.add_argument("--force", action="store_true", help="fence a live run (restart after a crash)")
    p.add_argument("--on-data-loss", default="fail")
    p.add_argument("--retries", type=int, default=8)
    p.add_argument("--lease-s", type=float, default=30.0)
    p.add_argument(
        "--batch-timeout",
        type=float,
        default=None,
        help="F13: run_job(batch_timeout_s=...), seconds (default: the library's)",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=DatabaseSettings.lock_timeout_s,
        help="F13: DatabaseSettings(lock_timeout_s=...), seconds",
    )
    p.add_argument(
        "--idle-in-transaction-timeout",
        type=float,
        default=DatabaseSettings.idle_in_transaction_timeout_s,
        help="F13: DatabaseSettings(idle_in_transaction_timeout_s=...), seconds",
    )
    p.add_argument("--speculation", action="store_true", help="F6: aggressive Spark speculation")
    p.add_argument(
        "--low-latency",
        type=float,
        default=0.0,
        help="F18: low-latency mode, epochs of this many seconds (commit_max_records: --max-per-partition)",
    )
    p.add_argument(
        "--many",
        action="store_true",
        help="F19: each topic is a job of its own (JOB-0, JOB-1, ...), all run by run_jobs in shared rounds",
    )
    p.add_argument("--faults", default="{}", help="a FaultPlan as JSON")
    p.add_argument("--kill-at-plan", type=int, default=0, help="F1: SIGKILL self after the n-th plan")
    p.add_argument("--run-dir", default="", help="progress files for the harness")
    return p


def _kill_after_plan(n: int) -> None:
    """F1 'plan': replace the runner's planner by one that dies (-9) right after the n-th plan,
    whose seeding/skips are committed, before any task of that batch has started."""
    real = runner.plan_batch  # type: ignore[attr-defined]
    calls = [0]

    def plan_then_die(*args: Any, **kwargs: Any) -> Any:
        plan = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] >= n:
            os.kill(os.getpid(), signal.SIGKILL)
        return plan

    runner.plan_batch = plan_then_die  # type: ignore[attr-defined]


def _many(spark: Any, job: str, topics: list[str], common: dict[str, Any]) -> JobSummary:
    """F19: a job per topic (``job-<i>``), all at once in shared rounds; their summaries summed, or
    the first failed job's error raised."""
    result = run_jobs(spark, {f"{job}-{i}": {**common, "topics": [t]} for i, t in enumerate(topics)})
    for name, exc in sorted(result.errors.items()):
        logger.error("job %s failed: %s: %s", name, type(exc).__name__, exc)
    if result.errors:
        raise next(iter(v for _, v in sorted(result.errors.items())))
    total = JobSummary(job=job, generation=max(s.generation for s in result.summaries.values()))
    for summary in result.summaries.values():
        total.records += summary.records
        total.batches += summary.batches
        total.committed += summary.committed
        total.already_committed += summary.already_committed
        total.stopped_by = summary.stopped_by
    logger.info("run_jobs: %d rounds carried %d batches", result.rounds, result.round_batches)
    return total


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_dir = Path(args.run_dir) if args.run_dir else None
    try:
        plan = FaultPlan(**{**json.loads(args.faults), "driver_pid": 0})
        if plan.kill_point and plan.kill_point not in ("timer", "plan"):
            plan = FaultPlan(**{**json.loads(args.faults), "driver_pid": os.getpid()})
        url = os.environ.get(args.database_url_env, "")
        timeouts = {
            "connect_timeout_s": 5.0,
            "lock_timeout_s": args.lock_timeout,
            "idle_in_transaction_timeout_s": args.idle_in_transaction_timeout,
        }
        db = DatabaseSettings(Secret(url), schema=args.schema, **timeouts)
        # the harness finds this job's connections by their application_name (F3)
        db = DatabaseSettings(
            Secret(db.url.update_query_dict({"application_name": args.app_name}).render_as_string(False)),
            schema=args.schema,
            **timeouts,
        )
        kafka = KafkaSettings(args.kafka_bootstrap)
        writer = PartitionWriter(
            write=CountWrite(args.schema, plan),
            decode=decode_user,
            aggregate=CountUsers(plan),
            after_commit=AfterCommit(plan),
        )
        limits = Limits(
            max_records_per_partition=args.max_per_partition, max_records_per_batch=args.max_per_batch or None
        )
        conf = {"spark.task.maxFailures": "3"}
        if args.speculation:
            # F6: speculate early and often, so duplicate attempts of the same range really run
            conf |= {
                "spark.speculation": "true",
                "spark.speculation.interval": "50ms",
                "spark.speculation.quantile": "0.1",
                "spark.speculation.multiplier": "1.1",
                "spark.speculation.minTaskRuntime": "50ms",
            }
        spark = LazySpark(f"chaos-{args.job}", args.master, conf)
        if args.kill_at_plan:
            _kill_after_plan(args.kill_at_plan)

        def progress(report: BatchReport) -> None:
            if run_dir is not None:
                with (run_dir / "batches").open("a") as fh:
                    fh.write(f"{report.number} {report.records}\n")

        # F13: a small batch timeout when asked for, else the library's default; F18: low-latency mode
        options: dict[str, Any] = {}
        if args.batch_timeout is not None:
            options["batch_timeout_s"] = args.batch_timeout
        if args.max_tasks:
            # F2: as many tasks as ranges, so each range's first attempt fails at its own fault point
            # (sharing a task, an earlier range's fault would end the attempt before a later one's)
            options["read"] = ReadOptions(max_tasks=args.max_tasks)
        if args.low_latency:
            low = LowLatency(epoch_s=args.low_latency, commit_max_records=args.max_per_partition)
            options["low_latency"] = low
        common: dict[str, Any] = {
            "kafka": kafka,
            "database": db,
            "writer": writer,
            "start": StartPolicy.earliest(),
            "limits": limits,
            "batch_interval_s": args.batch_interval,
            "until_caught_up": not args.follow,
            "on_data_loss": args.on_data_loss,
            "force": args.force,
            "lease_s": args.lease_s,
            "on_batch": progress,
            "retries": args.retries,
            "retry_backoff_s": 0.5,
            **options,
        }
        topics = args.topics.split(",")
        try:
            if args.many:
                summary = _many(spark, args.job, topics, common)
            else:
                summary = run_job(spark, job=args.job, topics=topics, **common)
        finally:
            if spark.session is not None:
                spark.session.stop()
    except TxnOffsetsError as exc:
        print(f"chaos-job: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(
        f"chaos-job: records={summary.records} batches={summary.batches} committed={summary.committed} "
        f"already_committed={summary.already_committed} stopped_by={summary.stopped_by}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
