"""The seeded chaos harness of txn_offsets (issue 6): real job processes, real faults, checked.

``python -m chaos`` (``make chaos``) runs scenarios F1..F14 against the local PostgreSQL and Kafka,
each in fresh topics and a fresh Postgres schema, checks the invariants after every run and ends
with one line ``chaos: runs=R faults=F messages=M lost=L duplicated=D``. See docs/reliability.md.
"""
