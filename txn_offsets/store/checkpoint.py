"""Deprecated: moved to :mod:`txn_offsets.admin.checkpoint`.

Kept for one release so that old imports still work; importing it warns.
"""

import warnings

from txn_offsets.admin.checkpoint import CheckpointOffsets, parse_offsets_file, read_checkpoint

__all__ = ["CheckpointOffsets", "parse_offsets_file", "read_checkpoint"]

warnings.warn(
    "txn_offsets.store.checkpoint is deprecated: import from txn_offsets.admin.checkpoint",
    DeprecationWarning,
    stacklevel=2,
)
