"""The Spark side of txn_offsets: sessions and their probes, a batch's tasks (the task bodies in
:mod:`~txn_offsets.spark.tasks`, on the RDD or the DataFrame path), writers and the runner; the
Structured Streaming adapter in :mod:`txn_offsets.spark.stream`."""
