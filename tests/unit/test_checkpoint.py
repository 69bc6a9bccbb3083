"""Reading Structured Streaming checkpoints (pure): the last committed batch's END offsets, a planned
but uncommitted batch refused unless named, and any corrupt input a ConfigError naming the file."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txn_offsets.admin.checkpoint import parse_offsets_file, read_checkpoint
from txn_offsets.errors import ConfigError

META = {
    "batchWatermarkMs": 0,
    "batchTimestampMs": 1700000000000,
    "conf": {"spark.sql.shuffle.partitions": "2"},
}

topics = st.text(alphabet="abcdefghij-_.0123456789", min_size=1, max_size=12)
source_offsets = st.dictionaries(
    topics,
    st.dictionaries(st.integers(0, 63), st.integers(0, 2**40), min_size=1, max_size=4),
    min_size=1,
    max_size=3,
)


def offsets_text(sources: list[dict[str, dict[int, int]] | None]) -> str:
    # stamped now, as Spark stamps a batch after fetching its offsets: an import checks the records
    # before the offsets are older than the checkpoint
    lines = ["v1", json.dumps({**META, "batchTimestampMs": int(time.time() * 1000)})]
    for src in sources:
        lines.append(
            "-"
            if src is None
            else json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in src.items()})
        )
    return "\n".join(lines)


def write_checkpoint(root: Path, batches: list[dict[str, dict[int, int]]], committed: int) -> None:
    """offsets/0..n-1 and commits/0..committed-1, plus the .crc files a local filesystem leaves."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for i, offsets in enumerate(batches):
        (root / "offsets" / str(i)).write_text(offsets_text([offsets]))
        (root / "offsets" / f".{i}.crc").write_bytes(b"\x00crc")
    for i in range(committed):
        (root / "commits" / str(i)).write_text('v1\n{"nextBatchWatermarkMs":0}')


@settings(max_examples=60, deadline=None)
@given(st.lists(source_offsets, min_size=1, max_size=5), st.data())
def test_the_last_committed_batch_is_where_to_continue(
    batches: list[dict[str, dict[int, int]]], data: st.DataObject
) -> None:
    committed = data.draw(st.integers(1, len(batches)))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        write_checkpoint(root, batches, committed)
        if committed < len(batches):  # the query stopped mid-batch: refused unless named
            with pytest.raises(ConfigError, match=f"batch {len(batches) - 1} was planned but not committed"):
                read_checkpoint(root)
            named = data.draw(st.sampled_from([committed - 1, len(batches) - 1]))
            found = read_checkpoint(root, batch=named)
        else:
            named = committed - 1
            found = read_checkpoint(root)
    expected = {(t, p): o for t, ps in batches[named].items() for p, o in ps.items()}
    assert (found.batch, dict(found.offsets), found.last_planned) == (named, expected, len(batches) - 1)


@given(st.lists(st.one_of(st.none(), source_offsets), min_size=1, max_size=4))
def test_sources_are_merged_and_empty_sources_skipped(
    sources: list[dict[str, dict[int, int]] | None],
) -> None:
    merged: dict[tuple[str, int], int] = {}
    clash = False
    for src in sources:
        for t, ps in (src or {}).items():
            for p, o in ps.items():
                clash |= merged.get((t, p), o) != o
                merged[(t, p)] = o
    text = offsets_text(sources)
    if clash:
        with pytest.raises(ConfigError, match="two sources"):
            parse_offsets_file(text)
    elif not merged:
        with pytest.raises(ConfigError, match="no Kafka offsets"):
            parse_offsets_file(text)
    else:
        assert parse_offsets_file(text) == merged


@given(st.text(max_size=300))
def test_garbage_is_a_config_error_never_a_crash(text: str) -> None:
    message = ""
    try:
        parse_offsets_file(text, "offsets/3")
    except ConfigError as exc:
        message = str(exc)
    else:
        return  # random text that happens to be a valid offsets file
    assert message.startswith("--from-spark-checkpoint: offsets/3: ") and "\n" not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('v9\n{}\n{"t":{"0":1}}', "expected the log version 'v1'"),
        ('v1\nnot json\n{"t":{"0":1}}', "line 2 (the batch metadata) is not JSON"),
        ('v1\n{}\n{"t":{"zero":1}}', "is not partition -> offset"),
        ('v1\n{}\n{"t":{"0":-2}}', "is not a resolved offset"),
        ("v1\n{}\n[1, 2]", "is not a Kafka source's offsets"),
        ("v1\n{}", "has 2 line(s)"),
    ],
)
def test_corrupt_offsets_files(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_offsets_file(text)


def test_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        read_checkpoint(tmp_path / "missing")
    with pytest.raises(ConfigError, match="has no offsets/<batch> files"):
        read_checkpoint(tmp_path)
    write_checkpoint(tmp_path / "c", [{"t": {0: 5}}], committed=0)
    with pytest.raises(ConfigError, match="no batch was committed"):
        read_checkpoint(tmp_path / "c")
    with pytest.raises(ConfigError, match="--checkpoint-batch 7 is not in offsets/"):
        read_checkpoint(tmp_path / "c", batch=7)
    assert dict(read_checkpoint(tmp_path / "c", batch=0).offsets) == {("t", 0): 5}
