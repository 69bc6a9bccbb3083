"""Reading a Structured Streaming checkpoint's Kafka offsets (pure: files in, offsets out).

A query's checkpoint directory holds two logs, one file per micro-batch id:

* ``offsets/<id>``: written when batch ``id`` is planned. Line 1 is the log version (``v1``), line 2
  the batch metadata (JSON), then one line per source of the query: for a Kafka source a JSON
  object ``{"topic": {"partition": offset, ...}, ...}`` holding the batch's END offsets (the next
  offset to read), ``-`` for a source without offsets yet.
* ``commits/<id>``: written when batch ``id`` has finished (its output written). Line 1 ``v1``,
  then a small JSON object.

So the position to continue from is the offsets file of the highest batch id that has a commit
file: nothing after it was written by the query. A batch that is planned but not committed (the
query stopped mid-batch) may or may not have written its output; which to take cannot be guessed,
so it is refused unless the caller names the batch. Files other than plain batch ids (``.0.crc``
checksums, ``.tmp`` files) are ignored, as Spark does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from txn_offsets.errors import ConfigError
from txn_offsets.ranges import TopicPartition

__all__ = ["CheckpointOffsets", "parse_offsets_file", "read_checkpoint"]

SETTING = "--from-spark-checkpoint"
_VERSIONS = ("v1",)
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's legal topic names


@dataclass(frozen=True)
class CheckpointOffsets:
    """The Kafka offsets to continue from, and which batch of the checkpoint they end."""

    batch: int
    offsets: Mapping[TopicPartition, int]
    last_planned: int  # the highest batch id in offsets/ (> batch: a planned, uncommitted batch)


def _bad(where: str, problem: str) -> ConfigError:
    return ConfigError(SETTING, f"{where}: {problem}")


def _version(line: str, where: str) -> None:
    if line.strip() not in _VERSIONS:
        raise _bad(
            where,
            f"line 1 is {line.strip()[:40]!r}, expected the log version 'v1' (not a Spark checkpoint log?)",
        )


def parse_offsets_file(text: str, where: str = "offsets file") -> dict[TopicPartition, int]:
    """The Kafka offsets of one ``offsets/<id>`` file (every Kafka source of the query merged)."""
    lines = text.splitlines()
    if len(lines) < 3:
        raise _bad(
            where,
            f"has {len(lines)} line(s); an offsets file has the version, the metadata and "
            f"one line per source",
        )
    _version(lines[0], where)
    try:
        meta = json.loads(lines[1])
    except ValueError:
        raise _bad(where, "line 2 (the batch metadata) is not JSON") from None
    if not isinstance(meta, dict):
        raise _bad(where, "line 2 (the batch metadata) is not a JSON object")
    out: dict[TopicPartition, int] = {}
    for number, line in enumerate(lines[2:], start=3):
        if line.strip() in ("-", ""):
            continue  # a source that had no offsets yet
        try:
            source = json.loads(line)
        except ValueError:
            raise _bad(where, f"line {number} is not JSON (a source's offsets)") from None
        if not isinstance(source, dict) or not source:
            raise _bad(
                where,
                f'line {number} is not a Kafka source\'s offsets ({{"topic": {{"partition": offset}}}})',
            )
        for topic, parts in source.items():
            if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or not isinstance(parts, dict):
                raise _bad(where, f"line {number}: {str(topic)[:60]!r} is not a topic with partition offsets")
            for part, off in parts.items():
                if (
                    not (isinstance(part, str) and part.isdigit())
                    or isinstance(off, bool)
                    or not isinstance(off, int)
                ):
                    raise _bad(
                        where,
                        f"line {number}: {topic}[{str(part)[:20]}] = {str(off)[:20]} "
                        f"is not partition -> offset",
                    )
                if off < 0:
                    raise _bad(
                        where,
                        f"line {number}: {topic}[{part}] = {off} is not a resolved offset "
                        f"(-1/-2 mean latest/earliest; the query never ran this batch)",
                    )
                key = (topic, int(part))
                if key in out and out[key] != off:
                    raise _bad(where, f"{topic}[{part}] appears in two sources with different offsets")
                out[key] = off
    if not out:
        raise _bad(where, "has no Kafka offsets (no source of the query read Kafka?)")
    return out


def _batch_ids(directory: Path) -> dict[int, Path]:
    if not directory.is_dir():
        return {}
    return {int(p.name): p for p in directory.iterdir() if p.is_file() and p.name.isdigit()}


def read_checkpoint(checkpoint: Path, *, batch: int | None = None) -> CheckpointOffsets:
    """The offsets to continue from: those of the last committed batch, or of `batch` if given
    (which must be planned in offsets/; it may be the planned-but-uncommitted last one)."""
    root = Path(checkpoint)
    if not root.is_dir():
        raise _bad(str(root), "is not a directory (give the query's checkpointLocation)")
    planned = _batch_ids(root / "offsets")
    if not planned:
        raise _bad(
            str(root), "has no offsets/<batch> files: not a Structured Streaming checkpoint, or no batch ran"
        )
    committed = _batch_ids(root / "commits")
    for path in committed.values():
        first = path.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
        _version(first[0] if first else "", str(path))
    last = max(planned)
    if batch is None:
        done = sorted(set(committed) & set(planned))
        if not done:
            raise _bad(
                str(root),
                f"no batch was committed (batches 0..{last} planned); name one with --checkpoint-batch",
            )
        chosen = done[-1]
        if last > chosen:
            raise _bad(
                str(root),
                f"batch {last} was planned but not committed (last committed: {chosen}); its output "
                f"may or may not have been written: pass --checkpoint-batch {chosen} (continue after "
                f"the committed batch) or --checkpoint-batch {last} (its output was written)",
            )
    else:
        if batch not in planned:
            raise _bad(
                str(root), f"--checkpoint-batch {batch} is not in offsets/ (planned: {min(planned)}..{last})"
            )
        chosen = batch
    path = planned[chosen]
    text = path.read_text(encoding="utf-8", errors="replace")
    return CheckpointOffsets(chosen, parse_offsets_file(text, str(path)), last)
