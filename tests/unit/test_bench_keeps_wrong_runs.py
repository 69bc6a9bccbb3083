"""A bench run whose result differs from the oracle keeps its topics and offsets schema: the
2026-12-01 scale WrongResult could not be looked at after the fact (the bench had deleted them),
and a repro loop had to find what they would have shown (records Kafka never held)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import sink
from benchmarks.bench import Bench, wrong_result
from benchmarks.worker import WorkerFailed, _answer


def test_a_workers_error_names_its_kind() -> None:
    def fails() -> dict[str, Any]:
        raise sink.WrongResult("scale p1024 on t: 2 wrong")

    answer = _answer(fails)
    assert answer["ok"] is False and answer["kind"] == "WrongResult"
    assert answer["error"] == "WrongResult: scale p1024 on t: 2 wrong"


@pytest.mark.parametrize(
    ("exc", "kept"),
    [
        (WorkerFailed("eo_partition: WrongResult: ...", "WrongResult"), True),
        (sink.WrongResult("here"), True),
        (WorkerFailed("eo_partition: ValueError: ...", "ValueError"), False),
        (WorkerFailed("eo_partition: no answer within 600s"), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_only_a_wrong_result_keeps_the_run(exc: BaseException, kept: bool) -> None:
    assert wrong_result(exc) is kept


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a kept run's Kafka or database was touched ({name})")


def test_a_kept_run_deletes_nothing_and_says_what_it_kept(capsys: pytest.CaptureFixture[str]) -> None:
    disposed: list[bool] = []
    engine = SimpleNamespace(dispose=lambda: disposed.append(True), begin=lambda: _Untouchable().begin)
    bench: Any = SimpleNamespace(
        datasets={(8, 10, False): SimpleNamespace(topic="bench-p8-x")},
        kafka=_Untouchable(),
        db=SimpleNamespace(schema="bench_1234"),
        engine=engine,
    )
    Bench.close(bench, keep=True)
    out = capsys.readouterr().out
    assert "kept topics bench-p8-x and schema bench_1234" in out
    assert disposed == [True]
