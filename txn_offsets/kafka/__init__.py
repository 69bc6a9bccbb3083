"""Kafka side of txn_offsets: metadata and planning inputs (driver), the exact range reader (executor)."""
