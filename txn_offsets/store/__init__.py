"""The offset store: PostgreSQL tables that hold each job's Kafka offsets next to its results.

What it promises:
- an offset moves only by a guarded claim (``off = from`` and the run's generation) inside the
  transaction that writes the range's results, so results and offsets commit or roll back together
  (the commit core, :mod:`txn_offsets.commit`, owns that transaction and is the only place that
  claims; :mod:`~txn_offsets.store.offset_rows` never commits);
- a claim that loses is classified there, never guessed: already committed, conflict or fenced;
- each run bumps the job's generation and fences the older ones (:mod:`~txn_offsets.store.runs`);
- database failures surface as the library's named errors (:mod:`~txn_offsets.store.database`,
  which also keeps one engine per Python worker for Spark tasks);
- the driver side holds it as one object, :class:`~txn_offsets.store.handle.Store` (engine,
  settings, tables, error translation), handed to every function instead of an (engine, db) pair;
- a record the decoder rejected (dead-letter mode) is written in its range's transaction
  (:mod:`~txn_offsets.store.dead_letters`);
- the tables (:mod:`~txn_offsets.store.schema`) change only through migrations
  (:mod:`~txn_offsets.store.migrate`).
"""
