"""The DataFrame path builds each session's ``spark.range(0, n, 1, n)`` once (issue 46): a DataFrame
keeps its analysed schema, which every batch's mapInArrow asks for - a JVM round trip per batch on
classic Spark, an AnalyzePlan RPC under Spark Connect, saved after the first batch."""

from __future__ import annotations

from typing import Any

from txn_offsets.spark import frames


class FakeSession:
    """A session whose range() makes a new frame each call, and counts them."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, int, int]] = []

    def range(self, *args: int) -> Any:
        self.ranges.append(args)  # type: ignore[arg-type]
        return FakeFrame(self)


class FakeFrame:
    def __init__(self, session: FakeSession) -> None:
        self.sparkSession = session


def test_a_session_builds_its_task_frame_once_per_task_count() -> None:
    a, b = FakeSession(), FakeSession()
    first = frames.task_frame(a, 2)
    assert frames.task_frame(a, 2) is first
    assert a.ranges == [(0, 2, 1, 2)]
    assert frames.task_frame(a, 3) is not first and a.ranges[-1] == (0, 3, 1, 3)
    other = frames.task_frame(b, 2)
    assert other is not first and other.sparkSession is b and b.ranges == [(0, 2, 1, 2)]


def test_a_frame_of_another_session_under_the_same_key_is_not_reused() -> None:
    a = FakeSession()
    stale = FakeFrame(FakeSession())  # a session gone, whose id() the new one got
    frames._TASK_FRAMES[(str(id(a)), 2)] = stale
    assert frames.task_frame(a, 2) is not stale
    assert a.ranges == [(0, 2, 1, 2)]
