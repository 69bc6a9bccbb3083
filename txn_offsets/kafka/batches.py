"""Kafka's record batches (magic 2) as a Fetch answer carries a partition's log: the records of an
offset range, and how far they take the range's position.

Decoded as librdkafka delivers them: control batches (transaction markers) are never records but
move the position; a batch's records before the position (a fetch starts at the batch holding the
fetch offset) are skipped; offsets are the batch's base plus each record's delta (compaction leaves
gaps); the timestamp is the batch's max under LogAppendTime, else its base plus the record's delta.
Under read_committed the batches of aborted transactions are skipped by the answer's list of them,
as Kafka's consumer does (:func:`read_batches`' `aborted`). Every codec Kafka has: gzip (zlib),
snappy (raw, or in the xerial framing Kafka's Java producer writes), lz4 (the LZ4 frame format)
and zstd (cramjam). CRCs are not checked (librdkafka's ``check.crcs`` is off by default: TCP's and
TLS's own checks hold).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import cramjam

from txn_offsets.kafka.records import Record

__all__ = ["Undecodable", "read_batches"]

#: base offset, batch length, partition leader epoch, magic, crc, attributes, last offset delta,
#: base timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_HEAD = struct.Struct(">qiibIhiqqqhii")
_PEEK = struct.Struct(">qi")  # base offset, batch length (after its own field); the magic is at 16
_LOG_OVERHEAD = 12  # base offset + batch length: what `length` does not count
_CODEC, _LOG_APPEND_TIME, _TRANSACTIONAL, _CONTROL = 0x07, 0x08, 0x10, 0x20
_CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class Undecodable(Exception):
    """A batch this module does not decode: an older magic, a codec it does not know, a body that
    does not decompress. The caller reads the range with librdkafka instead (which says why)."""


def read_batches(
    data: bytes,
    topic: str,
    partition: int,
    *,
    position: int,
    until: int,
    out: list[Record],
    aborted: Sequence[tuple[int, int]] | None = None,
) -> int:
    """Append to `out` the records of `data` (one partition's record batches) at offsets in
    ``[position, until)``, in offset order; return the position they reach: past the last batch
    read whole, `until` at most. A batch cut short at the end of `data` (the broker fills an answer
    up to its byte limit) is left for the next fetch, and so is one it cannot decode after others
    were read (:class:`Undecodable` only when it is the first: then librdkafka reads from it).

    `aborted`, under read_committed: the answer's aborted transactions, (producer id, first
    offset) each. A transactional batch of a producer whose aborted transaction began at or before
    the batch's last offset, and before that transaction's abort marker, is skipped - as Kafka's
    own consumer and librdkafka decide, from the same answer."""
    pending = sorted(aborted or (), key=lambda a: a[1])  # by first offset
    open_aborts: set[int] = set()  # producers inside an aborted transaction at this batch
    at, end = 0, len(data)
    started = position
    while position < until and at + 17 <= end:
        base, length = _PEEK.unpack_from(data, at)
        magic = data[at + 16]
        batch_end = at + _LOG_OVERHEAD + length
        if batch_end > end:
            break
        if magic != 2:
            if position > started:  # what came before it stands: the next fetch starts at it
                return position
            raise Undecodable(f"a record batch of magic {magic} at offset {base}")
        head = _HEAD.unpack_from(data, at)
        attributes, last_delta, base_ts, max_ts, count = head[5], head[6], head[7], head[8], head[12]
        after = base + last_delta + 1
        skip = bool(attributes & _CONTROL)
        if aborted is not None and attributes & _TRANSACTIONAL:
            while pending and pending[0][1] < after:
                open_aborts.add(pending.pop(0)[0])
            producer = head[9]
            if skip:
                if producer in open_aborts and _is_abort_marker(data[at + _HEAD.size : batch_end]):
                    open_aborts.discard(producer)
            else:
                skip = producer in open_aborts
        if not skip and after > position:
            body = data[at + _HEAD.size : batch_end]
            if attributes & _CODEC:
                try:
                    body = _decompress(attributes & _CODEC, body, base)
                except Undecodable:
                    if position > started:
                        return position  # as above
                    raise
            times = (base_ts, max_ts if attributes & _LOG_APPEND_TIME else None)
            where = (topic, partition)
            # no gap inside the batch (its deltas, strictly increasing from 0, end at last_delta):
            # record i is at base + i
            dense = count == last_delta + 1
            span = (position, until)
            if _records(body, count, base, where=where, times=times, span=span, out=out, dense=dense):
                return until
        position = max(position, min(after, until))
        at = batch_end
    return position


def _is_abort_marker(body: bytes) -> bool:
    """Whether a control batch's (uncompressed) first record is an ABORT marker: its key is
    (version int16, type int16), type 0 ABORT, 1 COMMIT."""
    at = _varint(body, 0)[1]  # record length
    at = _varint(body, at + 1)[1]  # attributes, then the timestamp delta
    at = _varint(body, at)[1]  # offset delta
    key_len, at = _varint(body, at)
    return key_len >= 4 and body[at + 2 : at + 4] == b"\0\0"


def _records(
    body: bytes,
    count: int,
    base: int,
    *,
    where: tuple[str, int],
    times: tuple[int, int | None],
    span: tuple[int, int],
    out: list[Record],
    dense: bool = False,
) -> bool:
    """Append the records of one batch's `body` at offsets in `span`, [position, until); True
    when one at or past `until` was met (the range is complete). `where`: (topic, partition);
    `times`: the batch's base timestamp and its max when that is every record's (LogAppendTime),
    else None; `dense`: the batch has no gap (record i is at base + i), so the records before `position` are
    passed over by their length alone (a range that starts inside a batch) and the one at `until`
    is not decoded."""
    topic, partition = where
    base_ts, stamp = times
    position, until = span
    at = 0
    before = min(position - base, count) if dense and position > base else 0
    for _ in range(before):
        byte = body[at]
        length, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        at += length
    last = min(count, until - base) if dense else count  # the records to decode end before `last`
    append = out.append
    new = tuple.__new__
    # A varint of one byte (most lengths and deltas of small records) is looked up here, a longer
    # one read by _varint: a call per varint was a third of the decoding.
    for _ in range(last - before):
        byte = body[at]
        length, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        start = at
        at += 1  # attributes (unused)
        byte = body[at]
        ts_delta, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        byte = body[at]
        offset_delta, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        offset = base + offset_delta
        if offset >= until:
            return True
        if offset < position:
            at = start + length
            continue
        byte = body[at]
        key_len, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        key = None if key_len < 0 else body[at : at + key_len]
        at += max(key_len, 0)
        byte = body[at]
        value_len, at = (_ONE_BYTE[byte], at + 1) if byte < 0x80 else _varint(body, at)
        value = None if value_len < 0 else body[at : at + value_len]
        at += max(value_len, 0)
        n_headers, at = _varint(body, at)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if n_headers > 0:
            pairs = []
            for _h in range(n_headers):
                name_len, at = _varint(body, at)
                name = body[at : at + name_len].decode("utf-8", "replace")
                at += name_len
                size, at = _varint(body, at)
                pairs.append((name, None if size < 0 else body[at : at + size]))
                at += max(size, 0)
            headers = tuple(pairs)
        at = start + length
        ts = stamp if stamp is not None else base_ts + ts_delta
        append(new(Record, (topic, partition, offset, key, value, ts if ts >= 0 else None, headers)))
    return last < count


#: the value of each one-byte zigzag varint
_ONE_BYTE = tuple((byte >> 1) ^ -(byte & 1) for byte in range(0x80))


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A zigzag varint at `at`: (its value, the index after it)."""
    byte = data[at]
    if byte < 0x80:  # one byte: most lengths and deltas
        return (byte >> 1) ^ -(byte & 1), at + 1
    value = byte & 0x7F
    shift = 7
    while True:
        at += 1
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), at + 1
        shift += 7


_XERIAL = b"\x82SNAPPY\x00"  # the xerial framing's magic; its version and compat ints follow
_XERIAL_HEAD = 16
_BLOCK = struct.Struct(">i")


def _decompress(codec: int, body: bytes, base: int) -> bytes:
    name = _CODECS.get(codec, f"codec {codec}")
    try:
        if codec == 1:
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if codec == 2:
            return _snappy(body)
        if codec == 3:
            return bytes(cramjam.lz4.decompress(body))
        if codec == 4:
            return bytes(cramjam.zstd.decompress(body))
    except (zlib.error, cramjam.DecompressionError, struct.error, ValueError):
        raise Undecodable(
            f"a record batch compressed with {name} at offset {base} does not decompress"
        ) from None
    raise Undecodable(f"a record batch compressed with {name} at offset {base}")


def _snappy(body: bytes) -> bytes:
    """Raw snappy (librdkafka's producer), or xerial-framed blocks (Kafka's Java producer)."""
    if not body.startswith(_XERIAL):
        return bytes(cramjam.snappy.decompress_raw(body))
    blocks, at = [], _XERIAL_HEAD
    while at < len(body):
        (size,) = _BLOCK.unpack_from(body, at)
        at += _BLOCK.size
        if size < 0 or at + size > len(body):
            raise ValueError("a xerial block past the batch's end")
        blocks.append(bytes(cramjam.snappy.decompress_raw(body[at : at + size])))
        at += size
    return b"".join(blocks)
