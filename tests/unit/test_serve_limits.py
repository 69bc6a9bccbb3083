"""The bounds of `serve`'s connections (issue 42, item 3): read from the environment, checked, and
the connection limit fitted under the descriptor limit with room for the process's own."""

from __future__ import annotations

import pytest

from txn_offsets.errors import ConfigError
from txn_offsets.service.server import (
    BACKLOG,
    DEFAULT_MAX_CONNECTIONS,
    OWN_DESCRIPTORS,
    Limits,
    connection_limit,
    limits_from_env,
)


def test_defaults() -> None:
    assert limits_from_env({}) == Limits(None, 5.0, 8192)
    assert limits_from_env({"TXN_OFFSETS_SERVE_MAX_CONNECTIONS": " "}) == Limits()


def test_values_from_the_environment() -> None:
    env = {
        "TXN_OFFSETS_SERVE_MAX_CONNECTIONS": "8",
        "TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S": "1.5",
        "TXN_OFFSETS_SERVE_MAX_HEAD_BYTES": "4096",
    }
    assert limits_from_env(env) == Limits(8, 1.5, 4096)


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("TXN_OFFSETS_SERVE_MAX_CONNECTIONS", "0"),
        ("TXN_OFFSETS_SERVE_MAX_CONNECTIONS", "2.5"),
        ("TXN_OFFSETS_SERVE_MAX_CONNECTIONS", "many"),
        ("TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S", "0"),
        ("TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S", "nan"),
        ("TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S", "inf"),
        ("TXN_OFFSETS_SERVE_HEAD_TIMEOUT_S", "-1"),
        ("TXN_OFFSETS_SERVE_MAX_HEAD_BYTES", "100"),
        ("TXN_OFFSETS_SERVE_MAX_HEAD_BYTES", "8k"),
    ],
)
def test_bad_values_name_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var):
        limits_from_env({var: raw})


@pytest.mark.parametrize(
    "kwargs", [{"max_connections": 0}, {"max_connections": True}, {"head_timeout_s": float("nan")}]
)
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_the_connection_limit_fits_under_the_descriptor_limit() -> None:
    reserved = OWN_DESCRIPTORS + 2 * BACKLOG
    assert connection_limit(Limits(), descriptors=None) == DEFAULT_MAX_CONNECTIONS  # unlimited
    assert connection_limit(Limits(), descriptors=1024) == DEFAULT_MAX_CONNECTIONS
    assert connection_limit(Limits(), descriptors=256) == 256 - reserved  # lowered to fit
    assert connection_limit(Limits(max_connections=8), descriptors=256) == 8
    with pytest.raises(ConfigError, match=r"TXN_OFFSETS_SERVE_MAX_CONNECTIONS.*at most 832"):
        connection_limit(Limits(max_connections=1000), descriptors=1024)
    with pytest.raises(ConfigError, match="ulimit -n"):
        connection_limit(Limits(), descriptors=reserved + 10)
