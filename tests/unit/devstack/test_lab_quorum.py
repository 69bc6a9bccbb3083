"""The lab's KRaft readiness (:mod:`txn_offsets.devstack.lab.quorum`): the DescribeQuorum v1 request it
writes, the answers it reads (bytes a lab's controllers sent, 2026-11-28: a follower's refusal and the
leader's answer), and when every voter counts as caught up."""

from __future__ import annotations

import struct

from txn_offsets.devstack.lab import quorum

NOT_LEADER = bytes.fromhex(
    "0000000100000002135f5f636c75737465725f6d6574616461746102000000000006000000000000000000000000000000000101000000"
)
LEADER = bytes.fromhex(
    "0000000100000002135f5f636c75737465725f6d657461646174610200000000000000000003000000040000000000000c6c04000000"
    "010000000000000c6c000001a2239d2084000001a2239d208400000000020000000000000c6c000001a2239d2084000001a2239d2084"
    "00000000030000000000000c6c000001a2239d2149000001a2239d21490001000000"
)


def test_the_request_is_describe_quorum_v1_of_the_metadata_log() -> None:
    raw = quorum.encode(7, client="c")
    assert struct.unpack(">i", raw[:4])[0] == len(raw) - 4
    assert struct.unpack(">hhih", raw[4:14]) == (55, 1, 7, 1)
    assert raw[14:16] == b"c\0"  # the client id, then no tagged fields
    assert raw[16:] == b"\x02\x13__cluster_metadata\x02\0\0\0\0\0\0\0"


def test_a_follower_refuses_and_the_leader_answers_with_its_voters() -> None:
    assert quorum.decode(NOT_LEADER, 1).error == quorum.NOT_LEADER
    q = quorum.decode(LEADER, 1)
    assert (q.error, q.leader, q.epoch, q.high_watermark) == (0, 3, 4, 3180)
    assert [(v.node, v.log_end_offset) for v in q.voters] == [(1, 3180), (2, 3180), (3, 3180)]
    assert q.voters[0].last_caught_up_ms == 0x1A2239D2084


def test_ready_only_when_every_voter_caught_up_recently() -> None:
    q = quorum.decode(LEADER, 1)
    newest = max(v.last_caught_up_ms for v in q.voters)
    assert quorum.lagging(q, 3, newest + 1_000) == ""
    late = quorum.lagging(q, 3, q.voters[0].last_caught_up_ms + quorum.CAUGHT_UP_MS + 1)
    assert late.startswith("voters behind the leader 3: node 1 at 3180 of 3180")
    assert quorum.lagging(q, 4, newest) == "3 of 4 voters in the quorum"
    assert quorum.lagging(quorum.decode(NOT_LEADER, 1), 3, newest).startswith("no quorum leader answered")
