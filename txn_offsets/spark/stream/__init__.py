"""The Structured Streaming adapter: :mod:`~txn_offsets.spark.stream.query` (``open_stream``, the
run of a job as a query), :mod:`~txn_offsets.spark.stream.source` (``readStream.format("txn_offsets")``,
planned from the offset table) and :mod:`~txn_offsets.spark.stream.sink` (the exactly-once
``foreachBatch`` sink). Each imports pyspark: import them when a stream is opened, not before."""
