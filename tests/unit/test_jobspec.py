"""JobSpec: one validated description of a run, built by run_job and open_stream from their keywords."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets import ConfigError, Limits, StartPolicy, run_job
from txn_offsets.plan.planner import TopicSelection
from txn_offsets.spark.spec import JobSpec
from txn_offsets.spark.stream.query import open_stream
from txn_offsets.spark.tasks import ReadOptions


def test_defaults_are_the_public_defaults_of_run_job_and_open_stream() -> None:
    spec = JobSpec.of(job="j", topics=["t"])
    assert spec.selection == TopicSelection(("t",), None)
    assert (spec.limits, spec.read, spec.start) == (Limits(), ReadOptions(), None)
    for func in (run_job, open_stream):
        params = inspect.signature(func).parameters
        for name in ("on_data_loss", "lease_s", "force"):
            assert params[name].default == getattr(spec, name), (func.__name__, name)
    assert inspect.signature(run_job).parameters["batch_timeout_s"].default == spec.batch_timeout_s
    assert inspect.signature(run_job).parameters["execution"].default == spec.execution


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"job": ""}, "job"),
        ({"job": "x" * 201}, "job"),
        ({"topics": []}, "topics"),
        ({"topics": "orders"}, "topics"),
        ({"topics": ["t"], "topic_pattern": "t.*"}, "topics"),
        ({"on_data_loss": "ignore"}, "on_data_loss"),
        ({"lease_s": 0}, "lease_s"),
        ({"lease_s": True}, "lease_s"),
        ({"batch_timeout_s": 0}, "batch_timeout_s"),
        ({"execution": "rdds"}, "execution"),
        ({"start": "earliest"}, "start"),
        ({"limits": {"max_records_per_batch": 10}}, "limits"),
        ({"read": 2000}, "read"),
    ],
)
def test_bad_input_names_the_setting(kwargs: dict[str, Any], setting: str) -> None:
    options: dict[str, Any] = {"job": "j", "topics": ["t"]}
    options.update(kwargs)
    if options["topics"] == []:
        options.pop("topics")
    with pytest.raises(ConfigError) as err:
        JobSpec.of(**options)
    assert err.value.setting == setting


@given(
    job=st.text(min_size=1, max_size=200).filter(str.strip),
    lease_s=st.floats(min_value=0.001, max_value=1e6),
    policy=st.sampled_from(["fail", "skip"]),
)
def test_a_valid_spec_is_frozen_and_keeps_what_it_was_given(job: str, lease_s: float, policy: str) -> None:
    spec = JobSpec.of(
        job=job, topic_pattern="p.*", start=StartPolicy.earliest(), on_data_loss=policy, lease_s=lease_s
    )
    assert (spec.job, spec.lease_s, spec.on_data_loss, spec.selection.pattern) == (
        job,
        lease_s,
        policy,
        "p.*",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.job = "other"  # type: ignore[misc]
