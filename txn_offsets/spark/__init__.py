"""The Spark side of txn_offsets: sessions, the RDD of a batch's ranges, writers and the runner."""
