"""The hand-written Kafka client's response reader (txn_offsets.kafka.wire.Reader) reads back what
the encoders wrote: unsigned varints of any size, fixed-size fields one by one or several at once,
and skips compact int32 arrays (a Metadata answer's replicas) to exactly where the next field starts."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.kafka import wire

INT32 = st.integers(-(2**31), 2**31 - 1)
# a field: an unsigned varint, an int16 + int32 head, or a compact int32 array (None: null)
FIELD = st.one_of(
    st.tuples(st.just("varint"), st.integers(0, 2**63)),
    st.tuples(st.just("head"), st.tuples(st.integers(-(2**15), 2**15 - 1), INT32)),
    st.tuples(st.just("ints"), st.one_of(st.none(), st.lists(INT32, max_size=300))),
)
HEAD = struct.Struct(">hi")


def _encoded(kind: str, value: object) -> bytes:
    if kind == "varint":
        return wire.uvarint(value)  # type: ignore[arg-type]
    if kind == "head":
        return HEAD.pack(*value)  # type: ignore[misc]
    if value is None:
        return wire.uvarint(0)  # a null compact array
    return wire.compact_array([struct.pack(">i", v) for v in value])  # type: ignore[attr-defined]


@given(st.lists(FIELD, max_size=30))
def test_the_reader_reads_back_each_field_and_skips_arrays_to_the_next(
    fields: list[tuple[str, object]],
) -> None:
    data = b"".join(_encoded(kind, value) for kind, value in fields) + b"\x7f"
    r = wire.Reader(data)
    for kind, value in fields:
        if kind == "varint":
            assert r.uvarint() == value
        elif kind == "head":
            assert r.fields(HEAD) == value
        else:
            r.skip_int32s()
    assert r.int8() == 0x7F and r.at == len(data)  # the next field, right where it starts
