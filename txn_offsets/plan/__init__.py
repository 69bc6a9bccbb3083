"""Step 1 of the protocol: planning, one planner for N jobs (one job is N = 1).

:mod:`~txn_offsets.plan.planner` turns stored offsets and Kafka's end offsets into each job's next
batch; :mod:`~txn_offsets.plan.moves` settles what a plan moves first (seeds, topic ids adopted,
data-loss skips); :mod:`~txn_offsets.plan.data_loss` decides what is data loss and what a plan does
about it; :mod:`~txn_offsets.plan.shared` serves the plans many jobs ask for at the same time
together (``run_jobs``).
"""
