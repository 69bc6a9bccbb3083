"""The chaos job on the lab's Spark cluster: ``python -m chaos.scenarios.lab_job`` = ``chaos.job`` with
its session on the standalone master instead of ``local[N]``.

Run on the driver host. ``CHAOS_LAB_SPARK`` (JSON) holds the session's settings: the master, the packed
job environment (``spark.archives ...#env``, executors run ``./env/bin/python``), the zip of
``chaos/`` the tasks import the writer from (``spark.submit.pyFiles``), the driver's address and the
workers' sizes - what docs/operations.md's spark-submit command sets, given in-process.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from chaos import job
from chaos.scenarios import lab_decode

VARIABLE = "CHAOS_LAB_SPARK"


def _cluster_session(self: job.LazySpark) -> Any:
    if self.session is None:
        from pyspark.sql import SparkSession

        settings: dict[str, str] = json.loads(os.environ[VARIABLE])
        app, _, conf = self._args
        os.environ["PYSPARK_PYTHON"] = "./env/bin/python"  # what spark-submit sets from spark.pyspark.python
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        job.logger.info(job.SPARK_STARTING)
        builder = SparkSession.builder.appName(app)
        for key, value in {**settings, **conf}.items():
            builder = builder.config(key, value)
        self.session = builder.getOrCreate()
        self.sparkContext = self.session.sparkContext
    return self.session


def main(argv: list[str] | None = None) -> int:
    if VARIABLE not in os.environ:
        print(
            f"chaos-job: ConfigError: {VARIABLE} is not set (run by python -m chaos --lab)", file=sys.stderr
        )
        return 2
    job.LazySpark.started = _cluster_session  # type: ignore[method-assign]
    job.decode_user = lab_decode.decode_user  # type: ignore[attr-defined]  # the job env has no msgspec
    return job.main(argv)


if __name__ == "__main__":
    sys.exit(main())
