"""tfgpu._internal.helpers.cluster: one TF_CONFIG / Slurm parser for strategy(), `tfgpu env` and the monitor.

The callers' own behaviour is tested with them (test_distribute, test_env, test_monitor);
here: what strict and lenient parsing accept, and the corners they share.
"""

from __future__ import annotations

import json

import pytest

from tfgpu._internal.helpers.cluster import (
    Cluster,
    TFConfigError,
    parse_tf_config,
    resolve_cluster,
)


def _raw(cluster, task=None) -> str:
    config = {"cluster": cluster}
    if task is not None:
        config["task"] = dict(zip(("type", "index"), task))
    return json.dumps(config)


@pytest.mark.parametrize(
    "raw",
    [
        "{}",
        _raw({"worker": ["a:1"]}),  # one task needs no "task"
        _raw({"worker": ["a:1"]}, ("evaluator", 0)),  # an evaluator outside the cluster
        _raw({"trainer": ["a:1", "b:2"]}, ("trainer", 1)),  # job names TensorFlow allows
        _raw({"worker": ["a:1"], "ps": ["b:2"]}, ("ps", 0)),
    ],
)
def test_lenient_accepts_what_tensorflow_accepts_and_strict_does_not(raw):
    parse_tf_config(raw, strict=False)
    with pytest.raises(TFConfigError):
        parse_tf_config(raw, strict=True)


def test_blank_means_unset():
    assert parse_tf_config(None) is None and parse_tf_config("  ") is None
    assert resolve_cluster({"TF_CONFIG": ""}) == Cluster("none", 1)


def test_the_error_carries_the_problem_and_a_keras_style_message():
    with pytest.raises(TFConfigError) as info:
        parse_tf_config(_raw({"worker": ["a:99999"]}, ("worker", 0)))
    assert info.value.problem == "job 'worker' has the address 'a:99999', expected \"host:port\""
    assert str(info.value).startswith(
        f"Invalid `TF_CONFIG` environment variable: {info.value.problem}. Received: TF_CONFIG="
    )
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("address", ["a:0", "a:65536", ":80", "a:\u00b2", "a"])
def test_addresses_need_a_host_and_a_port_in_range(address):
    with pytest.raises(TFConfigError, match='expected "host:port"'):
        parse_tf_config(_raw({"worker": [address]}), strict=False)


def test_task_ids_of_a_mapping_are_its_keys():
    raw = _raw({"worker": {"0": "a:1", "2": "b:2"}}, ("worker", 2))
    cluster = parse_tf_config(raw)
    assert cluster.spec == {"worker": ["a:1", "b:2"]} and cluster.task_index == 2
    with pytest.raises(TFConfigError, match="out of range"):
        parse_tf_config(_raw({"worker": {"0": "a:1", "2": "b:2"}}, ("worker", 1)))
    with pytest.raises(TFConfigError, match="non-integer task ids"):
        parse_tf_config(_raw({"worker": {"x": "a:1"}}, ("worker", 0)))


@pytest.mark.parametrize(
    "cluster, task, chief",
    [
        ({"worker": ["a:1", "b:1"]}, ("worker", 0), True),
        ({"worker": ["a:1", "b:1"]}, ("worker", 1), False),
        ({"chief": ["c:1"], "worker": ["a:1"]}, ("worker", 0), False),
        ({"chief": ["c:1"], "worker": ["a:1"]}, ("chief", 0), True),
        ({"worker": ["a:1"], "evaluator": ["e:1"]}, ("evaluator", 0), False),
    ],
)
def test_is_chief(cluster, task, chief):
    assert parse_tf_config(_raw(cluster, task), strict=False).is_chief is chief


def test_slurm_step_counts_over_the_job():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}
    assert resolve_cluster(env) == Cluster("slurm", 2, "worker", 1)
    assert resolve_cluster({**env, "SLURM_STEP_NUM_TASKS": "1"}) == Cluster("none", 1)
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_TASKS='x'"):
        resolve_cluster({**env, "SLURM_STEP_NUM_TASKS": "x"})
