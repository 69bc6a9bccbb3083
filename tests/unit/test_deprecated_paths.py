"""Old import paths keep working for one release: each still imports, warns with a
DeprecationWarning that names the new place, and hands out the very objects of the new module.

The objects must be *defined* in the new module only: Spark pickles task bodies and the stream
source by their module path, and module-level state (open streams, engine caches) must exist once.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

# old module -> (new module, names it re-exports)
MOVED: dict[str, tuple[str, tuple[str, ...]]] = {
    "txn_offsets.spark.streaming": ("txn_offsets.spark.stream.query", ("TxnStream", "open_stream")),
    "txn_offsets.spark.stream_source": (
        "txn_offsets.spark.stream.source",
        ("FORMAT", "StreamConfig", "TxnOffsetsSource", "bound_source"),
    ),
    "txn_offsets.spark.stream_sink": ("txn_offsets.spark.stream.sink", ("ExactlyOnceSink",)),
    "txn_offsets.spark.cluster": ("txn_offsets.devstack.cluster", ("StandaloneCluster",)),
    "txn_offsets.spark.executor": (
        "txn_offsets.spark.tasks",
        (
            "DeadLetter",
            "PartitionTask",
            "ReadOptions",
            "ReadTask",
            "TaskReport",
            "commit_reporting",
            "decoded",
            "dispose_worker_engines",
            "success_counts",
            "worker_engine",
            "write_dead_letters",
        ),
    ),
}


def _import_fresh(name: str) -> types.ModuleType:
    sys.modules.pop(name, None)  # a module warns when it is executed, i.e. on its first import
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_imports_warns_and_gives_the_same_objects(old: str) -> None:
    new_name, names = MOVED[old]
    new = importlib.import_module(new_name)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated") as caught:
        module = _import_fresh(old)
    assert any(new_name in str(w.message) or "from txn_offsets" in str(w.message) for w in caught)
    assert sorted(module.__all__) == sorted(names)
    for name in names:
        obj = getattr(module, name)
        assert obj is getattr(new, name), f"{old}.{name} is not {new_name}.{name}"
        if isinstance(obj, type | types.FunctionType):
            # defined once, in the new module: Spark pickles it by that path
            assert obj.__module__ == new_name, f"{name} is defined in {obj.__module__}"


@pytest.mark.parametrize("name", ["is_connect", "session_cores"])
def test_session_probes_moved_out_of_frames_warn(name: str) -> None:
    from txn_offsets.spark import frames, session

    with pytest.warns(DeprecationWarning, match=rf"frames\.{name} is deprecated.*spark\.session"):
        obj = getattr(frames, name)
    assert obj is getattr(session, name)
    assert obj.__module__ == "txn_offsets.spark.session"
    with pytest.raises(AttributeError):
        _ = frames.no_such_name  # type: ignore[attr-defined]
