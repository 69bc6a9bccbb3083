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

_TASKS = "txn_offsets.spark.tasks"
_DATABASE = "txn_offsets.store.database"
_DEAD_LETTERS = "txn_offsets.store.dead_letters"

# old module -> {name it re-exports: the module that now defines it}
MOVED: dict[str, dict[str, str]] = {
    "txn_offsets.spark.streaming": dict.fromkeys(
        ("TxnStream", "open_stream"), "txn_offsets.spark.stream.query"
    ),
    "txn_offsets.spark.stream_source": dict.fromkeys(
        ("FORMAT", "StreamConfig", "TxnOffsetsSource", "bound_source"), "txn_offsets.spark.stream.source"
    ),
    "txn_offsets.spark.stream_sink": {"ExactlyOnceSink": "txn_offsets.spark.stream.sink"},
    "txn_offsets.spark.cluster": {"StandaloneCluster": "txn_offsets.devstack.cluster"},
    "txn_offsets.sinks": dict.fromkeys(("COPY_MIN_ROWS", "upsert_add"), "txn_offsets.upserts"),
    "txn_offsets.spark.executor": {
        "DeadLetter": _DEAD_LETTERS,
        "PartitionTask": _TASKS,
        "ReadOptions": _TASKS,
        "ReadTask": _TASKS,
        "TaskReport": _TASKS,
        "commit_reporting": _TASKS,
        "decoded": _TASKS,
        "dispose_worker_engines": _DATABASE,
        "success_counts": _TASKS,
        "worker_engine": _DATABASE,
        "write_dead_letters": _DEAD_LETTERS,
    },
}


def _import_fresh(name: str) -> types.ModuleType:
    sys.modules.pop(name, None)  # a module warns when it is executed, i.e. on its first import
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_imports_warns_and_gives_the_same_objects(old: str) -> None:
    names = MOVED[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import .*txn_offsets\."):
        module = _import_fresh(old)
    assert sorted(module.__all__) == sorted(names)
    for name, new_name in names.items():
        new = importlib.import_module(new_name)
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


def test_the_store_write_callable_is_no_longer_called_writer() -> None:
    from txn_offsets.spark import writers
    from txn_offsets.store import transaction

    assert "Writer" not in transaction.__all__ and "TransactionWrite" in transaction.__all__
    with pytest.warns(DeprecationWarning, match=r"transaction\.Writer is deprecated.*TransactionWrite"):
        old = transaction.Writer  # type: ignore[attr-defined]
    assert old is transaction.TransactionWrite
    assert writers.Writer is not old  # Writer means one thing: what run_job takes


def _homes(module: str, *names: str) -> dict[str, str]:
    return {name: f"{module}:{name}" for name in names}


# issue 21: the admin operations moved to txn_offsets.admin
# old module -> {name it re-exports: "module:name" that now defines it}
MOVED_TO_ADMIN: dict[str, dict[str, str]] = {
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


@pytest.mark.parametrize("old", sorted(MOVED_TO_ADMIN))
def test_admin_paths_import_warn_and_give_the_same_objects(old: str) -> None:
    homes = MOVED_TO_ADMIN[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import .*txn_offsets\.admin\."):
        module = _import_fresh(old)
    assert sorted(module.__all__) == sorted(homes)
    for name, home in homes.items():
        new_name, _, new_attr = home.partition(":")
        obj = getattr(module, name)
        assert obj is getattr(importlib.import_module(new_name), new_attr), f"{old}.{name} is not {home}"
        if isinstance(obj, type | types.FunctionType):
            assert obj.__module__ == new_name, f"{name} is defined in {obj.__module__}"


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
