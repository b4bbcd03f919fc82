"""`tfgpu.strategy()`, cluster resolution, batch/LR arithmetic, and data-parallel equality.

Equality proofs run MirroredStrategy on the 4 logical CPU devices the conftest creates: after
the same steps with the same global batch, the weights equal single-device training.
"""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.workers.train import train
from tfgpu import distribute
from tfgpu._internal.helpers.cluster import resolve_cluster as _resolve_cluster
from tfgpu.distribute import _choose_all_reduce, _choose_kind

WORKERS2 = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def tf_config(cluster=WORKERS2, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.get_weights(), b.get_weights()))


def cpus(n):
    return [f"/cpu:{i}" for i in range(n)]


# --------------------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    "gpus, tasks, expected",
    [
        (0, 1, "default"),
        (1, 1, "one_device"),
        (4, 1, "mirrored"),
        (0, 2, "multi_worker"),
        (8, 3, "multi_worker"),
    ],
)
def test_auto_picks_from_hardware_and_cluster(gpus, tasks, expected):
    assert _choose_kind("auto", num_gpus=gpus, num_tasks=tasks) == expected


def test_kinds_are_case_insensitive_and_explicit_kind_wins():
    assert _choose_kind("Mirrored", num_gpus=0, num_tasks=1) == "mirrored"
    assert _choose_kind("ONE_DEVICE", num_gpus=4, num_tasks=1) == "one_device"
    assert _choose_kind("multi-worker", num_gpus=0, num_tasks=1) == "multi_worker"


def test_unknown_kind_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"Received: kind='tpu'.*'auto', 'default', 'one_device'"):
        tfgpu.strategy("tpu")
    with pytest.raises(TypeError, match="Expected a str"):
        tfgpu.strategy(2)


def test_tf_config_resolves_workers_and_chief():
    c = _resolve_cluster({"TF_CONFIG": tf_config(index=1)})
    assert (c.source, c.num_tasks, c.task_type, c.task_index, c.is_chief) == (
        "TF_CONFIG",
        2,
        "worker",
        1,
        False,
    )
    with_chief = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]}
    c = _resolve_cluster({"TF_CONFIG": tf_config(with_chief, "chief", 0)})
    assert c.num_tasks == 3 and c.is_chief
    assert _resolve_cluster({}).num_tasks == 1


@pytest.mark.parametrize(
    "raw, problem",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level is a list"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), '"cluster" is missing'),
        (json.dumps({"cluster": WORKERS2}), '"task" is missing'),
        (tf_config(index=2), r'"index" is 2 but job \'worker\' has 2 task'),
        (tf_config(index="0"), "expected an integer"),
        (tf_config(task_type="chief"), r"not a job of \"cluster\""),
        (tf_config({"worker": ["localhost"]}), 'expected "host:port"'),
        (tf_config({"wrker": ["h:1"]}), "unknown job 'wrker'"),
        (tf_config({"worker": ["h:1"], "ps": ["h:2"]}), "parameter-server"),
    ],
)
def test_malformed_tf_config_says_what_is_wrong(raw, problem):
    with pytest.raises(ValueError, match="Invalid `TF_CONFIG`") as info:
        _resolve_cluster({"TF_CONFIG": raw})
    assert info.match(problem)
    assert "Received: TF_CONFIG=" in str(info.value)


def test_strategy_reports_malformed_tf_config_before_building_anything(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        tfgpu.strategy()


SLURM_STEP = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
}


def test_slurm_step_is_a_cluster_resolved_by_tensorflow(monkeypatch):
    cluster = _resolve_cluster(SLURM_STEP)
    assert (cluster.source, cluster.num_tasks, cluster.task_index) == ("slurm", 2, 1)
    assert _choose_kind("auto", num_gpus=0, num_tasks=cluster.num_tasks) == "multi_worker"
    for key, value in SLURM_STEP.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver = distribute._slurm_resolver({**SLURM_STEP, "SLURM_GPUS_ON_NODE": "0"}, 9000)
    assert resolver.cluster_spec().as_dict() == {"worker": ["node07:9000", "node08:9000"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_tf_config_takes_precedence_over_slurm_and_single_slurm_task_is_local():
    env = {**SLURM_STEP, "TF_CONFIG": tf_config()}
    assert _resolve_cluster(env).source == "TF_CONFIG"
    assert _resolve_cluster({**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "1"}).num_tasks == 1


def test_all_reduce_choice():
    assert _choose_all_reduce("mirrored", "auto", on_gpus=True) == "nccl"
    assert _choose_all_reduce("mirrored", "auto", on_gpus=False) == "reduction_to_one_device"
    assert _choose_all_reduce("multi_worker", "auto", on_gpus=False) == "ring"
    assert _choose_all_reduce("multi_worker", "NCCL", on_gpus=True) == "nccl"
    assert _choose_all_reduce("default", "auto", on_gpus=False) is None
    with pytest.raises(ValueError, match="NCCL"):
        _choose_all_reduce("mirrored", "nccl", on_gpus=False)
    with pytest.raises(ValueError, match=r"Expected one of .*'nccl', 'ring'"):
        _choose_all_reduce("multi_worker", "hierarchical_copy", on_gpus=True)
    with pytest.raises(ValueError, match="nothing to reduce"):
        _choose_all_reduce("one_device", "ring", on_gpus=False)


# --------------------------------------------------------------------------- arithmetic


def test_global_batch_size_and_its_errors():
    assert tfgpu.global_batch_size(64, 4) == 256
    s = tf.distribute.MirroredStrategy(cpus(2))
    assert tfgpu.global_batch_size(32, s) == 64
    assert tfgpu.global_batch_size(32) == 32  # default strategy: one replica
    with pytest.raises(ValueError, match=r"Received: per_replica=0"):
        tfgpu.global_batch_size(0, 2)
    with pytest.raises(TypeError, match=r"per_replica=32.0"):
        tfgpu.global_batch_size(32.0, 2)
    with pytest.raises(TypeError, match=r"Expected a tf\.distribute\.Strategy"):
        tfgpu.global_batch_size(32, "mirrored")


def test_numpy_integers_are_accepted_and_python_ints_returned():
    # tfgpu.data.pipeline takes NumPy ints; the batch arithmetic feeding it must too.
    got = tfgpu.global_batch_size(np.int64(128), 2)
    assert got == 256 and type(got) is int
    got = tfgpu.global_batch_size(np.int32(64), np.int64(4))
    assert got == 256 and type(got) is int
    s = tf.distribute.MirroredStrategy(cpus(2))
    got = tfgpu.global_batch_size(np.int64(32), s)
    assert got == 64 and type(got) is int
    lr = tfgpu.scale_learning_rate(0.4, 2, base_replicas=np.int64(8))
    assert lr == pytest.approx(0.1) and type(lr) is float
    lr = tfgpu.scale_learning_rate(0.1, np.int64(8))
    assert lr == pytest.approx(0.8) and type(lr) is float
    # Still refused: NumPy floats and bools for counts, non-positive NumPy ints.
    with pytest.raises(TypeError, match=r"`per_replica`.*float"):
        tfgpu.global_batch_size(np.float64(32.0), 2)
    with pytest.raises(TypeError, match="`per_replica`"):
        tfgpu.global_batch_size(np.bool_(True), 2)
    with pytest.raises(ValueError, match=r"Received: per_replica=.*0"):
        tfgpu.global_batch_size(np.int64(0), 2)
    with pytest.raises(ValueError, match="`base_replicas`"):
        tfgpu.scale_learning_rate(0.1, 2, base_replicas=np.int64(0))


def test_scale_learning_rate_rules():
    assert tfgpu.scale_learning_rate(0.1, 8) == pytest.approx(0.8)
    assert tfgpu.scale_learning_rate(1e-3, 4, rule="sqrt") == pytest.approx(2e-3)
    assert tfgpu.scale_learning_rate(0.4, 2, base_replicas=8) == pytest.approx(0.1)
    s = tf.distribute.MirroredStrategy(cpus(4))
    assert tfgpu.scale_learning_rate(0.01, s, rule="linear") == pytest.approx(0.04)
    with pytest.raises(ValueError, match=r"Received: rule='cubic'.*'linear', 'sqrt'"):
        tfgpu.scale_learning_rate(0.1, 2, rule="cubic")
    with pytest.raises(ValueError, match="learning_rate=nan"):
        tfgpu.scale_learning_rate(math.nan, 2)
    with pytest.raises(TypeError, match=r"`rule`.*\(of type int\)"):
        tfgpu.scale_learning_rate(0.1, 2, rule=1)


def test_scale_learning_rate_takes_numpy_floats_and_refuses_overflow():
    lr = tfgpu.scale_learning_rate(np.float32(1e-3), 4)
    assert lr == pytest.approx(4e-3) and type(lr) is float
    assert tfgpu.scale_learning_rate(np.float64(0.1), np.int64(2)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"give the scaled learning rate = inf.*not a finite"):
        tfgpu.scale_learning_rate(1e308, 10)
    for bad in ("0.1", True, None, np.bool_(True)):
        with pytest.raises(TypeError, match="Invalid type for argument `learning_rate`"):
            tfgpu.scale_learning_rate(bad, 2)
    with pytest.raises(ValueError, match=r"learning_rate=inf"):
        tfgpu.scale_learning_rate(math.inf, 2)


def test_auto_and_default_on_cpu_give_the_default_strategy():
    default = tf.distribute.get_strategy()
    assert tfgpu.strategy() is default
    assert tfgpu.strategy("DEFAULT") is default


def test_mirrored_without_gpu_uses_logical_cpus_and_says_so():
    with pytest.warns(UserWarning, match="no GPU is visible.*4 logical CPU"):
        s = tfgpu.strategy("mirrored")
    assert isinstance(s, tf.distribute.MirroredStrategy) and s.num_replicas_in_sync == 4
    s2 = tfgpu.strategy("mirrored", devices=cpus(2), all_reduce="hierarchical_copy")
    assert s2.num_replicas_in_sync == 2
    assert isinstance(s2.extended._cross_device_ops, tf.distribute.HierarchicalCopyAllReduce)
    one = tfgpu.strategy("one_device", devices="/cpu:1")
    assert isinstance(one, tf.distribute.OneDeviceStrategy)
    assert one.extended.worker_devices[0].endswith("CPU:1")


def test_invalid_device_and_reduction_arguments_fail_before_building():
    with pytest.raises(ValueError, match="Received: devices=\\[\\]"):
        tfgpu.strategy("mirrored", devices=[])
    with pytest.raises(ValueError, match="kind='multi_worker'"):
        tfgpu.strategy("multi_worker", devices=cpus(2))
    with pytest.raises(ValueError, match="Expected a single device"):
        tfgpu.strategy("one_device", devices=cpus(2))
    with pytest.raises(ValueError, match="replicas on the CPU"):
        tfgpu.strategy("mirrored", devices=cpus(2), all_reduce="nccl")
    with pytest.raises(ValueError, match="timeout_s=0"):
        tfgpu.strategy("multi_worker", timeout_s=0)
    with pytest.raises(TypeError, match="timeout_s='10'"):
        tfgpu.strategy("multi_worker", timeout_s="10")
    with pytest.raises(TypeError, match=r"`devices`.*\(of type int\)"):
        tfgpu.strategy("mirrored", devices=3)
    with pytest.raises(ValueError, match="slurm_port_base=70000"):
        tfgpu.strategy(slurm_port_base=70000)


def test_devices_are_checked_against_the_machine_when_the_strategy_is_made():
    # This process has 4 logical CPUs and no GPU (tests/conftest.py).
    with pytest.raises(ValueError, match=r"'/gpu:3' is not one of them\. TensorFlow sees no GPU"):
        tfgpu.strategy("one_device", devices="/gpu:3")
    with pytest.raises(ValueError, match=r"devices this process has: '/device:CPU:0'.*'/cpu:7'"):
        tfgpu.strategy("mirrored", devices=["/cpu:0", "/cpu:7"])
    with pytest.raises(ValueError, match="'/gpu:0' is not one of them"):
        tfgpu.strategy("mirrored", devices=["/gpu:0", "/gpu:1"])
    with pytest.raises(ValueError, match="'CPU:1' is repeated"):
        tfgpu.strategy("mirrored", devices=["/cpu:1", "CPU:1"])
    with pytest.raises(ValueError, match="'bogus' is not one"):
        tfgpu.strategy("one_device", devices="bogus")
    with pytest.raises(ValueError, match="local device names"):
        tfgpu.strategy("one_device", devices="/job:worker/task:1/device:CPU:0")
    # Every spelling TensorFlow accepts for a device it has works.
    for spelling in (
        "/cpu:2",
        "CPU:2",
        "/device:CPU:2",
        "/job:localhost/replica:0/task:0/device:CPU:2",
    ):
        one = tfgpu.strategy("one_device", devices=spelling)
        assert one.extended.worker_devices[0].endswith("CPU:2")


def test_device_check_is_pure():
    from tfgpu.distribute import _check_devices

    have = ["/device:CPU:0", "/device:GPU:0", "/device:GPU:1"]
    assert _check_devices(["/gpu:1", "gpu:0"], have) == ["/device:GPU:1", "/device:GPU:0"]
    assert _check_devices(["/gpu"], have) == ["/device:GPU:0"]
    with pytest.raises(ValueError, match=r"'/gpu:2' is not one of them\.$"):
        _check_devices(["/gpu:2"], have)


# --------------------------------------------------------------------------- equality proofs


@pytest.fixture(scope="module")
def single_device():
    model, _ = train(None, epochs=3, global_batch=8)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 4])
def test_mirrored_equals_single_device(single_device, replicas):
    strategy = tfgpu.strategy("mirrored", devices=cpus(replicas))
    model, _ = train(strategy, epochs=3, global_batch=8)
    assert int(model.optimizer.iterations.numpy()) == 24 == int(single_device.optimizer.iterations)
    assert max_diff(model, single_device) < 1e-5  # float32 rounding: about 1e-7


@pytest.mark.slow
def test_uneven_last_batch_differs_and_drop_remainder_restores_equality():
    # 61 examples in batches of 8: the last batch has 5, split 3/2 over two replicas. Each
    # replica averages its own examples and the replicas' means are averaged, which is not
    # the mean over the 5 examples, so training drifts from the single-device run.
    s = tfgpu.strategy("mirrored", devices=cpus(2))
    ref, _ = train(None, epochs=2, examples=61)
    uneven, _ = train(s, epochs=2, examples=61)
    assert max_diff(uneven, ref) > 1e-3
    # The pipeline default under a strategy (drop_remainder=True) avoids the odd batch.
    ref_drop, _ = train(None, epochs=2, examples=61, drop_remainder=True)
    even, _ = train(s, epochs=2, examples=61, drop_remainder=True)
    assert max_diff(even, ref_drop) < 1e-5


@pytest.mark.slow
def test_mixed_float16_under_mirrored_trains_with_loss_scaling():
    keras.mixed_precision.set_global_policy("mixed_float16")
    s = tfgpu.strategy("mirrored", devices=cpus(2))
    model, history = train(s, epochs=2)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[0].compute_dtype == "float16"
    assert all(w.dtype == "float32" for w in model.trainable_weights)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert float(model.optimizer.dynamic_scale.numpy()) > 1.0


@pytest.mark.slow
def test_mixed_bfloat16_under_mirrored_needs_no_loss_scaling():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model, history = train(tfgpu.strategy("mirrored", devices=cpus(2)), epochs=2)
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.isfinite(history.history["loss"]).all()


def test_keras_correction_is_only_for_multi_worker():
    from tfgpu._internal.adapters import keras_internals

    assert not keras_internals.needs_multi_worker_correction(
        tf.distribute.MirroredStrategy(cpus(2))
    )
    assert not keras_internals.needs_multi_worker_correction(tf.distribute.get_strategy())


# --------------------------------------------------------------------------- several strategies

_SEVERAL_STRATEGIES = r"""
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfgpu

def collective_sum(strategy, n):
    # The strategy's collective all-reduce: MirroredStrategy's default on CPUs, and what it
    # uses under XLA on GPUs and MultiWorkerMirroredStrategy on several local GPUs.
    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([n], float(ctx.replica_id_in_sync_group + 1)))
    ops = strategy.extended._collective_ops
    out = tf.function(lambda v: ops.reduce(tf.distribute.ReduceOp.SUM, v, destinations=v))(x)
    return strategy.experimental_local_results(out)[0].numpy().tolist()

def plain():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def ours():
    return tfgpu.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])

print("first", collective_sum(plain(), 5))    # one experiment: a model with 5 weights
print("tfgpu", collective_sum(ours(), 3))     # the next one, another size
print("tfgpu", collective_sum(ours(), 2))     # and the next
try:
    collective_sum(plain(), 3)                # the same without tfgpu
except tf.errors.InvalidArgumentError as e:
    print("plain", "Shape mismatch in the collective instance" in str(e))
else:
    print("plain", "worked")
"""


@pytest.mark.slow
def test_each_strategy_has_its_own_collective_keys_in_a_fresh_process():
    from tests.conftest import run_python

    out = run_python(_SEVERAL_STRATEGIES).stdout.splitlines()
    assert out[:3] == [
        "first [3.0, 3.0, 3.0, 3.0, 3.0]",
        "tfgpu [3.0, 3.0, 3.0]",
        "tfgpu [3.0, 3.0]",
    ]
    # Upstream: two strategies built directly with TensorFlow share their keys, and the second
    # model's all-reduce aborts. When this line fails, TensorFlow fixed it: the key ranges in
    # tfgpu/distribute.py and tests/conftest.py can go.
    assert out[3] == "plain True", out


def test_collective_key_ranges_are_distinct_and_int32():
    bases = [distribute._collective_key_base(i) for i in range(3)]
    assert bases[0] > 1000 and len(set(bases)) == 3
    assert np.diff(bases).min() >= distribute._COLLECTIVE_KEY_STRIDE
    assert distribute._collective_key_base(200_000) < 2**31 - distribute._COLLECTIVE_KEY_STRIDE
    a, b = (tfgpu.strategy("mirrored", devices=cpus(2)) for _ in range(2))
    assert a.extended._collective_key_base != b.extended._collective_key_base
