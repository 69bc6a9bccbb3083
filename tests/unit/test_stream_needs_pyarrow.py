"""open_stream without pyarrow: one ConfigError before any run starts, not Spark's "Python worker
failed to connect back" after its timeout (found trying the README's stream example in a venv
installed without the connect extra)."""

from __future__ import annotations

import sys

import pytest

from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.errors import ConfigError
from txn_offsets.spark.stream.query import open_stream


def test_open_stream_without_pyarrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    # nothing is reached after the check: no session, no database, no broker is needed
    with pytest.raises(ConfigError) as raised:
        open_stream(
            None,
            job="j",
            kafka=KafkaSettings("127.0.0.1:1"),
            database=DatabaseSettings("postgresql+psycopg://u@127.0.0.1:1/d"),
            checkpoint_root="checkpoints",
            topics=["t"],
        )
    assert raised.value.setting == "pyarrow"
    assert "connect extra" in str(raised.value) and "\n" not in str(raised.value)
