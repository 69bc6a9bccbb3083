"""Run by tests/integration/kafka/test_admin_clients.py in a process of its own (a crash must not take
pytest down): planners in threads ask for a topic's partitions and offsets (and, with
FORGET_EVERY > 0, retire the process's clients every so many calls, as when Kafka was
unreachable) while the main thread deletes the topic and creates it again, over and over. Before
the fixes this process died within seconds (librdkafka's abort on a client destroyed in its own
thread; a double free with DescribeTopics and ListOffsets on one client). Prints
``calls=<n> errors=<n> recreated=<n> kept=<n>`` and exits 0 when it lived.

Usage: python -m tests.integration.recreate_stress BOOTSTRAP TOPIC SECONDS THREADS FORGET_EVERY"""

from __future__ import annotations

import gc
import sys
import threading
import time

from confluent_kafka.admin import AdminClient, NewTopic

from txn_offsets.config import KafkaSettings
from txn_offsets.errors import TxnOffsetsError
from txn_offsets.kafka import admins, metadata


def _create(manager: AdminClient, topic: str) -> None:
    for _ in range(200):  # deleting completes asynchronously on the broker: retry "exists"
        try:
            manager.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
            return
        except Exception:
            time.sleep(0.05)
    raise SystemExit(f"could not create {topic}")


def main(bootstrap: str, topic: str, seconds: float, threads: int, forget_every: int) -> int:
    gc.set_threshold(50)  # collections often, in whichever thread allocates: librdkafka's too
    kafka = KafkaSettings(bootstrap)
    manager = AdminClient({"bootstrap.servers": bootstrap})
    _create(manager, topic)
    stop = time.monotonic() + seconds
    counts = {"calls": 0, "errors": 0}
    lock = threading.Lock()

    def planner() -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            try:
                if forget_every and n % forget_every == 0:
                    admins.forget_admin_client(kafka)
                metadata.topics_and_watermarks(kafka, [topic], timeout_s=2.0)
            except TxnOffsetsError:
                with lock:
                    counts["errors"] += 1
            with lock:
                counts["calls"] += 1

    workers = [threading.Thread(target=planner) for _ in range(threads)]
    for w in workers:
        w.start()
    recreated = 0
    while time.monotonic() < stop:
        manager.delete_topics([topic])[topic].result(10)
        time.sleep(0.05)
        _create(manager, topic)
        recreated += 1
    for w in workers:
        w.join()
    time.sleep(admins.RETIRED_GRACE_S + 0.5)
    gc.collect()
    kept = admins.reap()
    print(f"calls={counts['calls']} errors={counts['errors']} recreated={recreated} kept={kept}")
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], a[1], float(a[2]), int(a[3]), int(a[4])))
