"""``txn-offsets serve``: the offset store as a read-only HTTP service.

:mod:`~txn_offsets.service.server` binds and runs it (uvicorn), :mod:`~txn_offsets.service.app`
holds the routes (/metrics, /offsets, /healthz, /readyz), :mod:`~txn_offsets.service.collector`
turns a :mod:`~txn_offsets.service.snapshot` of the store into Prometheus metric families,
:mod:`~txn_offsets.service.kafka_view` caches the Kafka queries for a few seconds, and
:mod:`~txn_offsets.service.health` checks PostgreSQL and Kafka in the background for the probes.
"""
