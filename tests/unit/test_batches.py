"""kafka.batches: record batches (magic 2) decoded into the records of one offset range, against
batches built here from Kafka's documented layout (Hypothesis: any batches, codecs, control
batches, offset gaps, a cut anywhere, any range)."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txn_offsets.kafka.batches import Undecodable, read_batches
from txn_offsets.kafka.records import Record

#: the xerial framing of snappy (Kafka's Java producer): magic, version 1, compatible 1, then
#: (length, raw snappy block) pairs
_XERIAL = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append((z & 0x7F) | 0x80)
        z >>= 7


def _field(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


@dataclass(frozen=True)
class Rec:
    delta: int
    key: bytes | None
    value: bytes | None
    ts_delta: int
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Batch:
    base: int
    last_delta: int
    records: tuple[Rec, ...]
    control: bool = False
    log_append: bool = False
    codec: int = 0
    base_ts: int = 1_795_000_000_000
    max_ts: int = 1_795_000_009_999
    magic: int = 2
    producer: int = -1
    transactional: bool = False
    xerial: bool = False  # snappy in xerial blocks (else raw, as librdkafka writes it)
    compressed: bool = True  # False: the codec bits on a body left plain (it does not decompress)

    def encode(self) -> bytes:
        body = b""
        for r in self.records:
            inner = b"\0" + _varint(r.ts_delta) + _varint(r.delta) + _field(r.key) + _field(r.value)
            inner += _varint(len(r.headers))
            for name, value in r.headers:
                inner += _field(name.encode()) + _field(value)
            body += _varint(len(inner)) + inner
        if self.compressed:
            body = _compress(self.codec, body, xerial=self.xerial)
        attributes = self.codec | (0x08 if self.log_append else 0) | (0x20 if self.control else 0)
        attributes |= 0x10 if self.transactional else 0
        after_length = (
            struct.pack(
                ">ibIhiqqqhii",
                0,
                self.magic,
                0,
                attributes,
                self.last_delta,
                self.base_ts,
                self.max_ts,
                self.producer,
                0,  # producer epoch
                -1,  # base sequence
                len(self.records),
            )
            + body
        )
        return struct.pack(">qi", self.base, len(after_length)) + after_length

    def visible(self) -> list[Record]:
        if self.control:
            return []
        return [
            Record(
                "t",
                3,
                self.base + r.delta,
                r.key,
                r.value,
                ts if (ts := self.max_ts if self.log_append else self.base_ts + r.ts_delta) >= 0 else None,
                r.headers,
            )
            for r in self.records
        ]

    @property
    def after(self) -> int:
        return self.base + self.last_delta + 1


def _compress(codec: int, body: bytes, *, xerial: bool) -> bytes:
    if codec == 1:
        z = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        return z.compress(body) + z.flush()
    if codec == 2 and xerial:
        blocks = [bytes(cramjam.snappy.compress_raw(body[i : i + 7])) for i in range(0, len(body), 7)]
        return _XERIAL + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(body))
    if codec == 3:
        return bytes(cramjam.lz4.compress(body))
    if codec == 4:
        return bytes(cramjam.zstd.compress(body))
    return body


# keys and values of one-byte lengths, and of lengths that take two (64 bytes and up: zigzag)
_bytes = st.none() | st.binary(max_size=12) | st.binary(min_size=60, max_size=200)
_rec_parts = st.tuples(
    _bytes, _bytes, st.integers(-5, 300), st.lists(st.tuples(st.text(max_size=4), _bytes), max_size=3)
)


@st.composite
def logs(draw: st.DrawFn) -> list[Batch]:
    """Batches of one partition in offset order: gaps between and inside them (compaction) or
    none inside (each record at its batch's base + its index), control batches, both timestamp
    types, every codec (snappy raw or xerial-framed)."""
    batches, offset = [], draw(st.integers(0, 5))
    codecs = [0, 1, 2, 3, 4]  # none, gzip, snappy, lz4, zstd
    for _ in range(draw(st.integers(0, 6))):
        offset += draw(st.integers(0, 3))
        control = draw(st.booleans()) and draw(st.booleans())
        n = 1 if control else draw(st.integers(1, 6))
        if draw(st.booleans()):  # no gap inside: record i at base + i (what a producer writes)
            deltas, last = list(range(n)), n - 1
        else:
            deltas = sorted(draw(st.sets(st.integers(0, 12), min_size=n, max_size=n)))
            last = deltas[-1] + draw(st.integers(0, 2))
        parts = [draw(_rec_parts) for _ in deltas]
        records = tuple(Rec(d, k, v, t, tuple(h)) for d, (k, v, t, h) in zip(deltas, parts, strict=True))
        batches.append(
            Batch(
                offset,
                last,
                records,
                control,
                draw(st.booleans()),
                0 if control else draw(st.sampled_from(codecs)),
                xerial=draw(st.booleans()),
            )
        )
        offset += last + 1
    return batches


@settings(max_examples=300, deadline=None)
@given(log=logs(), data=st.data())
def test_a_range_gets_the_visible_records_of_the_whole_batches_within_it(
    log: list[Batch], data: st.DataObject
) -> None:
    raw = b"".join(b.encode() for b in log)
    cut = data.draw(st.integers(0, len(raw)), label="cut")  # the broker's byte limit, anywhere
    ends = [len(b"".join(x.encode() for x in log[: i + 1])) for i in range(len(log))]
    whole = [b for b, end in zip(log, ends, strict=True) if end <= cut]
    top = max([b.after for b in log], default=0) + 2
    position = data.draw(st.integers(0, top), label="position")
    until = data.draw(st.integers(position, top + 2), label="until")
    out: list[Record] = []
    reached = read_batches(raw[:cut], "t", 3, position=position, until=until, out=out)
    assert out == [r for b in whole for r in b.visible() if position <= r.offset < until]
    assert reached == min(until, max([position] + [b.after for b in whole]))


def test_timestamps_headers_and_nulls_as_librdkafka_gives_them() -> None:
    create = Batch(
        10, 2, (Rec(0, None, b"", 5, (("h", None), ("h", b"x"))), Rec(2, b"", None, -2_000_000_000_000, ()))
    )
    append = Batch(13, 0, (Rec(0, b"k", b"v", 99, ()),), log_append=True, max_ts=42)
    out: list[Record] = []
    assert read_batches(create.encode() + append.encode(), "t", 3, position=0, until=100, out=out) == 14
    assert out == [
        Record("t", 3, 10, None, b"", 1_795_000_000_005, (("h", None), ("h", b"x"))),
        Record("t", 3, 12, b"", None, None, ()),  # a negative timestamp: none
        Record("t", 3, 13, b"k", b"v", 42, ()),  # LogAppendTime: the batch's
    ]


def test_a_control_batch_is_no_record_but_moves_the_position() -> None:
    marker = Batch(7, 0, (Rec(0, b"\0\0\0\0", b"\0\0\0\0\0\0", 0, ()),), control=True)
    out: list[Record] = []
    assert read_batches(marker.encode(), "t", 3, position=7, until=8, out=out) == 8
    assert out == []


@pytest.mark.parametrize(
    ("batch", "named"),
    [
        (Batch(0, 0, (Rec(0, None, b"v", 0, ()),), magic=1), "magic 1 at offset 0"),
        (Batch(5, 0, (Rec(0, None, b"v", 0, ()),), codec=5), "codec 5 at offset 5"),
        (Batch(5, 0, (Rec(0, None, b"v", 0, ()),), codec=3, compressed=False), "lz4 at offset 5 does not"),
        (Batch(5, 0, (Rec(0, None, b"v", 0, ()),), codec=2, compressed=False), "snappy at offset 5 does not"),
        (Batch(5, 0, (Rec(0, None, b"v", 0, ()),), codec=4, compressed=False), "zstd at offset 5 does not"),
        (Batch(5, 0, (Rec(0, None, b"v", 0, ()),), codec=1, compressed=False), "gzip at offset 5 does not"),
    ],
)
def test_what_it_does_not_decode_is_named(batch: Batch, named: str) -> None:
    raw = batch.encode()
    with pytest.raises(Undecodable, match=named):
        read_batches(raw, "t", 3, position=0, until=10, out=[])


@st.composite
def transactions(draw: st.DrawFn) -> tuple[list[Batch], list[tuple[int, int]], set[int]]:
    """A log of two transactional producers and a plain one, interleaved: each transaction's data
    batches then its COMMIT or ABORT marker (a control batch). (batches, every aborted transaction
    as (producer, first offset), the offsets of records a committed reader sees)."""
    log: list[Batch] = []
    aborted: list[tuple[int, int]] = []
    visible: set[int] = set()
    offset = 0
    open_at: dict[int, int] = {}  # producer -> first offset of its open transaction
    pending: dict[int, list[int]] = {}  # producer -> offsets of its open transaction's records
    steps = draw(st.lists(st.sampled_from(["plain", "p1", "p2", "end1", "end2"]), max_size=14))
    for step in [*steps, "end1", "end2"]:
        if step.startswith("end"):
            producer = int(step[-1])
            if producer not in open_at:
                continue
            commit = draw(st.booleans())
            key = b"\0\0\0\1" if commit else b"\0\0\0\0"  # version 0, type COMMIT (1) / ABORT (0)
            log.append(
                Batch(
                    offset,
                    0,
                    (Rec(0, key, b"\0\0\0\0\0\0", 0, ()),),
                    control=True,
                    producer=producer,
                    transactional=True,
                )
            )
            if commit:
                visible.update(pending.pop(producer))
            else:
                aborted.append((producer, open_at[producer]))
                pending.pop(producer)
            del open_at[producer]
            offset += 1
            continue
        n = draw(st.integers(1, 3))
        producer = -1 if step == "plain" else int(step[-1])
        log.append(
            Batch(
                offset,
                n - 1,
                tuple(Rec(i, None, b"v", 0, ()) for i in range(n)),
                producer=producer,
                transactional=producer > 0,
            )
        )
        if producer > 0:
            open_at.setdefault(producer, offset)
            pending.setdefault(producer, []).extend(range(offset, offset + n))
        else:
            visible.update(range(offset, offset + n))
        offset += n
    return log, aborted, visible


@settings(max_examples=300, deadline=None)
@given(txns=transactions(), data=st.data())
def test_read_committed_leaves_out_exactly_the_aborted_transactions(
    txns: tuple[list[Batch], list[tuple[int, int]], set[int]], data: st.DataObject
) -> None:
    log, aborted, visible = txns
    top = max([b.after for b in log], default=0)
    position = data.draw(st.integers(0, top), label="position")
    until = data.draw(st.integers(position, top), label="until")
    # what a broker answers a fetch at `position`: from the batch holding it, with the aborted
    # transactions that end at or after that batch (their markers are in or after the answer)
    first = next((i for i, b in enumerate(log) if b.after > position), len(log))
    answer = log[first:]
    start = answer[0].base if answer else top
    markers = {(b.producer, b.base) for b in log if b.control}
    listed = [(p, at) for p, at in aborted if min(m for q, m in markers if q == p and m >= at) >= start]
    out: list[Record] = []
    raw = b"".join(b.encode() for b in answer)
    reached = read_batches(raw, "t", 3, position=position, until=until, out=out, aborted=listed)
    assert [r.offset for r in out] == sorted(o for o in visible if position <= o < until)
    assert reached == until


def test_a_batch_it_cannot_decode_after_others_ends_the_answer_there() -> None:
    plain = Batch(0, 1, (Rec(0, None, b"a", 0, ()), Rec(1, None, b"b", 0, ())))
    broken = Batch(2, 0, (Rec(0, None, b"c", 0, ()),), codec=3, compressed=False)
    out: list[Record] = []
    assert read_batches(plain.encode() + broken.encode(), "t", 3, position=0, until=3, out=out) == 2
    assert [r.value for r in out] == [b"a", b"b"]
    with pytest.raises(
        Undecodable, match="lz4 at offset 2 does not decompress"
    ):  # the next fetch starts at it
        read_batches(broken.encode(), "t", 3, position=2, until=3, out=[])
