"""The low-latency mode of ``run_job``: ``run_job(..., low_latency=LowLatency(...))``.

Epochs of long-running Spark tasks, each following its partitions and committing small ranges
every few milliseconds with the batch mode's guarded claim + write + advance in one transaction:
options.py (:class:`LowLatency`), epochs.py (the driver), follow.py (the task), control.py (how
they talk: the job row). See docs/low_latency.md.
"""

from txn_offsets.spark.lowlatency.options import LowLatency

__all__ = ["LowLatency"]
