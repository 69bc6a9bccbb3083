"""Old import paths keep working for one release: each still imports, warns with a
DeprecationWarning that names the new place, and hands out the very objects of the new modules.

The objects must be *defined* in the new modules only: Spark pickles task bodies and the stream
source by their module path, and module-level state (open streams, engine caches) must exist once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

import pytest


def _homes(module: str, *names: str) -> dict[str, str]:
    return {name: f"{module}:{name}" for name in names}


_TASKS = "txn_offsets.spark.tasks"

# issue 21: old module -> {name it re-exports: "module:name" that now defines it}
MOVED: dict[str, dict[str, str]] = {
    # the Spark run modes in their own rooms, the store's concerns in store/
    "txn_offsets.spark.streaming": _homes("txn_offsets.spark.stream.query", "TxnStream", "open_stream"),
    "txn_offsets.spark.stream_source": _homes(
        "txn_offsets.spark.stream.source", "FORMAT", "StreamConfig", "TxnOffsetsSource", "bound_source"
    ),
    "txn_offsets.spark.stream_sink": _homes("txn_offsets.spark.stream.sink", "ExactlyOnceSink"),
    "txn_offsets.spark.cluster": _homes("txn_offsets.devstack.cluster", "StandaloneCluster"),
    "txn_offsets.sinks": _homes("txn_offsets.upserts", "COPY_MIN_ROWS", "upsert_add"),
    "txn_offsets.spark.executor": {
        **_homes(
            _TASKS,
            "PartitionTask",
            "ReadOptions",
            "ReadTask",
            "TaskReport",
            "commit_reporting",
            "success_counts",
        ),
        **_homes("txn_offsets.spark.records", "decoded"),
        **_homes("txn_offsets.store.database", "dispose_worker_engines", "worker_engine"),
        **_homes("txn_offsets.store.dead_letters", "DeadLetter", "write_dead_letters"),
    },
    # the admin operations moved to txn_offsets.admin
    "txn_offsets.store.checkpoint": _homes(
        "txn_offsets.admin.checkpoint", "CheckpointOffsets", "parse_offsets_file", "read_checkpoint"
    ),
    "txn_offsets.store.imports": {
        **_homes(
            "txn_offsets.admin.imports",
            "ImportPlan",
            "ImportStep",
            "apply_import",
            "plan_import",
            "select_topics",
        ),
        **_homes("txn_offsets.admin.sources", "read_table"),
    },
    "txn_offsets.cli.lag": _homes(
        "txn_offsets.admin.lag", "LagReport", "PartitionLag", "offset_lag", "partition_lags"
    ),
    "txn_offsets.cli.commands": {
        **_homes("txn_offsets.admin.lag", "LagReport", "PartitionLag", "offset_lag"),
        **_homes("txn_offsets.admin.reset", "ResetPlan", "ResetTarget", "apply_reset", "plan_reset"),
        **_homes(
            "txn_offsets.admin.views",
            "AuditRow",
            "JobRow",
            "OffsetRow",
            "audit_log",
            "list_jobs",
            "show_offsets",
        ),
        "PlanStep": "txn_offsets.admin.moves:Move",  # the move-plan shape that reset and import share
    },
}


def _import_fresh(name: str) -> types.ModuleType:
    sys.modules.pop(name, None)  # a module warns when it is executed, i.e. on its first import
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_imports_warns_and_gives_the_same_objects(old: str) -> None:
    homes = MOVED[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import ") as caught:
        module = _import_fresh(old)
    said = " ".join(str(w.message) for w in caught)
    assert any(home.partition(":")[0] in said for home in homes.values()), said  # names the new place
    assert sorted(module.__all__) == sorted(homes)
    for name, home in homes.items():
        new_name, _, new_attr = home.partition(":")
        obj = getattr(module, name)
        assert obj is getattr(importlib.import_module(new_name), new_attr), f"{old}.{name} is not {home}"
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


def test_cli_subcommands_registers_the_store_groups_from_their_modules() -> None:
    from txn_offsets.cli import db, imports, jobs, offsets

    with pytest.warns(
        DeprecationWarning, match=r"cli\.subcommands is deprecated: import .*txn_offsets\.cli\.db"
    ):
        module = _import_fresh("txn_offsets.cli.subcommands")
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers(dest="command", required=True))
    for argv, group in (
        (["db", "current"], db),
        (["offsets", "lag", "--job", "j", "--fail-over", "5"], offsets),
        (["offsets", "import", "--job", "j", "--from-table", "s.t"], imports),
        (["jobs", "list", "--format", "json"], jobs),
    ):
        handler = parser.parse_args(argv).handler
        assert handler.__module__ == group.__name__, (argv, handler)
