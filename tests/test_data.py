"""tfgpu.data.pipeline and benchmark: order of operations, sharding, files, bad input."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import prepare_tfds
from tfgpu import data as tfdata
from tfgpu._internal.adapters.datasets import made_by_pipeline, pipeline_arguments, source_batches
from tfgpu.data import _pipeline
from tfgpu.data._plan import Facts, decide, validation_plan

N = 64


def _ids(batches) -> list[int]:
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def _label_ids(ds) -> list[int]:
    return _ids(y for _, y in ds)


@pytest.fixture(scope="module")
def mirrored():
    return tf.distribute.MirroredStrategy(devices=["/cpu:0", "/cpu:1"])


class _Counter:
    """Counts how often a per-example function really runs (not how often it is traced)."""

    def __init__(self):
        self.calls = 0

    def _bump(self, x):
        self.calls += 1
        return x

    def decode(self, x, y):
        x = tf.py_function(self._bump, [x], tf.float32)
        return tf.ensure_shape(x, (4,)) * 2.0, y


def _xy(n=N):
    x = np.tile(np.arange(n, dtype=np.float32)[:, None], (1, 4))
    y = np.arange(n, dtype=np.int64)
    return x, y


def _noise(x, y):
    return x + tf.random.uniform(tf.shape(x)), y


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "bad, error",
    [
        (0, ValueError),
        (-3, ValueError),
        (2**70, ValueError),
        (2.5, TypeError),
        (True, TypeError),
        ("8", TypeError),
        (float("nan"), TypeError),
        (None, ValueError),
    ],
)
def test_batch_size_must_be_a_positive_integer(bad, error):
    traced = []
    with pytest.raises(error, match=r"`batch_size`.*Received"):
        tfdata.pipeline(_xy(), batch_size=bad, map_fn=lambda x, y: traced.append(1) or (x, y))
    assert traced == []  # raised before any work, map_fn never even traced


def test_batch_size_and_per_replica_batch_size_are_exclusive():
    with pytest.raises(ValueError, match="exactly one of them"):
        tfdata.pipeline(_xy(), batch_size=8, per_replica_batch_size=4)
    with pytest.raises(ValueError, match=r"per_replica_batch_size=0"):
        tfdata.pipeline(_xy(), per_replica_batch_size=0)


@pytest.mark.parametrize(
    "data",
    [{1, 2, 3}, 42, None, (i for i in range(3)), (np.zeros(3), object())],
    ids=["set", "int", "none", "generator", "object-leaf"],
)
def test_unsupported_data_type_is_a_type_error(data):
    with pytest.raises(TypeError, match=r"argument `data`.*Expected a NumPy array"):
        tfdata.pipeline(data, batch_size=2)


def test_mismatched_array_lengths():
    traced = []
    with pytest.raises(ValueError, match=r"different lengths.*data\[0\] has 10, data\[1\] has 9"):
        tfdata.pipeline(
            (np.zeros((10, 2)), np.zeros(9)),
            batch_size=2,
            map_fn=lambda x, y: traced.append(1) or (x, y),
        )
    assert traced == []
    with pytest.raises(ValueError, match=r"different lengths.*\['b'\] has 3"):
        tfdata.pipeline({"a": np.zeros(4), "b": np.zeros(3)}, batch_size=2)
    with pytest.raises(ValueError, match="scalar"):
        tfdata.pipeline((np.zeros(4), np.float32(1.0)), batch_size=2)
    with pytest.raises(ValueError, match="0 examples"):
        tfdata.pipeline(np.zeros((0, 3)), batch_size=2)


def test_shuffle_buffer_of_zero_and_conflicts():
    with pytest.raises(ValueError, match=r"`shuffle_buffer`. Received: shuffle_buffer=0"):
        tfdata.pipeline(_xy(), batch_size=8, shuffle_buffer=0)
    with pytest.raises(ValueError, match="shuffle=False and shuffle_buffer=10"):
        tfdata.pipeline(_xy(), batch_size=8, shuffle=False, shuffle_buffer=10)


def test_unknown_dataset_name_suggests_close_matches():
    with pytest.raises(ValueError, match=r"data='mnistt'.*Did you mean: 'mnist'"):
        tfdata.pipeline("mnistt", batch_size=8)


def test_other_bad_arguments(tmp_path, mirrored):
    with pytest.raises(TypeError, match="`map_fn`"):
        tfdata.pipeline(_xy(), batch_size=8, map_fn="decode")
    with pytest.raises(ValueError, match="distribute=True and strategy=None"):
        tfdata.pipeline(_xy(), batch_size=8, distribute=True)
    with pytest.raises(TypeError, match="`strategy`"):
        tfdata.pipeline(_xy(), batch_size=8, strategy="mirrored")
    with pytest.raises(TypeError, match=r"`cache`\. Received: cache=3"):
        tfdata.pipeline(_xy(), batch_size=8, cache=3)
    with pytest.raises(ValueError, match="does not exist"):
        tfdata.pipeline(_xy(), batch_size=8, cache=str(tmp_path / "nope" / "cache"))
    with pytest.raises(ValueError, match=r"batch_size=7.*2 replicas.*Expected a multiple of 2"):
        tfdata.pipeline(_xy(), batch_size=7, strategy=mirrored)
    with pytest.raises(FileNotFoundError, match="matches no files"):
        tfdata.pipeline(str(tmp_path / "*.tfrecord"), batch_size=8)
    with pytest.raises(ValueError, match="`split`/`data_dir`"):
        tfdata.pipeline(_xy(), batch_size=8, split="train")
    with pytest.raises(ValueError, match="`ram_budget_mib`"):
        tfdata.pipeline(_xy(), batch_size=8, ram_budget_mib=0)


# ----------------------------------------------------------------------------- order of operations


def test_every_example_once_per_epoch_and_reshuffled_each_epoch():
    ds = tfdata.pipeline(_xy(), batch_size=10)
    first, second = _label_ids(ds), _label_ids(ds)
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second  # a new order every epoch
    sizes = [int(y.shape[0]) for _, y in ds]
    assert sizes == [10] * 6 + [4]  # no strategy: the remainder is kept


def test_no_shuffle_keeps_order():
    ds = tfdata.pipeline(_xy(), batch_size=10, shuffle=False, deterministic=True)
    assert _label_ids(ds) == list(range(N))


@pytest.mark.slow
def test_no_shuffle_keeps_order_by_default_through_parallel_maps():
    """Predictions on `pipeline(x_test, shuffle=False)` must line up with the labels."""
    n = 4096
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    y = np.arange(n, dtype=np.int64)

    def uneven(x, y):  # per-example cost varies, so a non-deterministic map would reorder
        work = tf.reduce_sum(tf.random.uniform([tf.cast(y % 7, tf.int32) * 2000]))
        return x + 0.0 * work, y

    ds = tfdata.pipeline((x, y), batch_size=32, shuffle=False, map_fn=uneven, cache=False)
    assert ds.options().deterministic
    for _ in range(3):
        assert np.concatenate([b.numpy() for _, b in ds]).tolist() == list(range(n))


@pytest.mark.parametrize("cache", ["memory", "file"])
@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_no_shuffle_keeps_order_through_a_map_before_the_cache(cache, tmp_path):
    """The cache stops map fusion, so the parallel map alone must keep the order."""
    n = 4096
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    y = np.arange(n, dtype=np.int64)

    def uneven(x, y):  # deterministic, but its cost varies by example
        work = tf.reduce_sum(tf.range(tf.cast(y % 7, tf.int32) * 4000))
        return x + tf.cast(work * 0, tf.float32), y

    target = "memory" if cache == "memory" else tmp_path / "cache"
    ds = tfdata.pipeline((x, y), batch_size=32, shuffle=False, map_fn=uneven, cache=target)
    for _ in range(2):  # the pass that fills the cache, and one read from it
        assert np.concatenate([b.numpy() for _, b in ds]).tolist() == list(range(n))


def test_a_seed_makes_the_pipeline_deterministic_unless_told_otherwise():
    assert tfdata.pipeline(_xy(), batch_size=10, seed=3).options().deterministic
    assert not tfdata.pipeline(_xy(), batch_size=10).options().deterministic
    fast = tfdata.pipeline(_xy(), batch_size=10, seed=3, deterministic=False)
    assert not fast.options().deterministic


def test_cache_sits_before_augmentation():
    """Decode runs once over two epochs, and the augmentation is new every epoch."""
    counter = _Counter()
    ds = tfdata.pipeline(
        _xy(), batch_size=16, map_fn=counter.decode, augment_fn=_noise, deterministic=True
    )
    epochs = [{int(i): row for b_x, b_y in ds for i, row in zip(b_y, b_x.numpy())} for _ in "ab"]
    assert counter.calls == N  # decoded once: the second epoch came from the cache
    assert set(epochs[0]) == set(epochs[1]) == set(range(N))
    for i in range(N):
        base = 2.0 * i  # the decoded value; noise in [0, 1) on top
        assert np.all((epochs[0][i] >= base) & (epochs[0][i] < base + 1))
        assert not np.allclose(epochs[0][i], epochs[1][i])  # augmented afresh


def test_random_map_fn_is_not_cached_and_warns():
    def random_decode(x, y):
        return x + tf.random.uniform((4,)), y

    with pytest.warns(UserWarning, match="random ops"):
        ds = tfdata.pipeline(_xy(), batch_size=N, map_fn=random_decode, shuffle=False)
    a, b = (next(iter(ds))[0].numpy() for _ in range(2))
    assert not np.allclose(a, b)  # not frozen by a cache


def test_cache_larger_than_ram_budget_fails_before_work():
    counter = _Counter()
    with pytest.raises(ValueError, match=r"cache=True.*more than the RAM budget of 1.0 KiB"):
        tfdata.pipeline(
            _xy(), batch_size=8, map_fn=counter.decode, cache=True, ram_budget_mib=1 / 1024
        )
    assert counter.calls == 0
    # "auto" does not raise: it just does not cache, so decoding runs every epoch.
    ds = tfdata.pipeline(_xy(), batch_size=8, map_fn=counter.decode, ram_budget_mib=1 / 1024)
    list(ds), list(ds)
    assert counter.calls == 2 * N


def test_cache_to_a_file(tmp_path):
    counter = _Counter()
    prefix = tmp_path / "cache"
    ds = tfdata.pipeline(_xy(), batch_size=16, map_fn=counter.decode, cache=prefix)
    first = sorted(_label_ids(ds))
    assert any(p.name.startswith("cache") for p in tmp_path.iterdir())
    second = sorted(_label_ids(ds))
    assert first == second == list(range(N))
    assert counter.calls == N


def test_cache_prefix_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    ds = tfdata.pipeline(_xy(), batch_size=16, map_fn=_Counter().decode, cache="~/cache")
    assert sorted(_label_ids(ds)) == list(range(N))
    assert (tmp_path / "cache.index").is_file()  # written under $HOME, not ./~/


def _cache_leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(("cache_", "cache.")))


def _double(x, y):
    return x * 2.0, y


def test_leftovers_of_an_interrupted_file_cache_are_removed_with_a_warning(tmp_path):
    # What a process killed during the first pass leaves: the shard lockfile and temp files.
    (tmp_path / "cache_0.lockfile").write_text("Created at: 1700000000")
    (tmp_path / "cache_0.data-00000-of-00001.tempstate1234567890").write_bytes(b"")
    (tmp_path / "cachex_0.lockfile").write_text("another cache's, left alone")
    counter = _Counter()
    with pytest.warns(UserWarning, match=r"interrupted.*cache_0\.lockfile") as record:
        ds = tfdata.pipeline(_xy(), batch_size=16, map_fn=counter.decode, cache=tmp_path / "cache")
    assert "cache_0.data-00000-of-00001.tempstate1234567890" in str(record[0].message)
    assert sorted(_label_ids(ds)) == sorted(_label_ids(ds)) == list(range(N))
    assert counter.calls == N  # the second pass read the rebuilt cache
    assert (tmp_path / "cachex_0.lockfile").exists()
    assert not [n for n in _cache_leftovers(tmp_path) if "lockfile" in n or "tempstate" in n]
    assert (tmp_path / "cache.index").is_file()

    # A completed cache is never touched, whatever lies beside it.
    (tmp_path / "cache_0.lockfile").write_text("Created at: 1700000000")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = tfdata.pipeline(
            _xy(), batch_size=16, map_fn=counter.decode, cache=tmp_path / "cache"
        )
    assert (tmp_path / "cache_0.lockfile").exists()
    assert sorted(_label_ids(again)) == list(range(N)) and counter.calls == N


@pytest.mark.slow
def test_a_cache_being_written_in_this_process_is_not_removed(tmp_path):
    prefix = tmp_path / "cache"
    n = 20_000  # unshuffled, so only the prefetched batches pass the cache before next() returns
    ds = tfdata.pipeline(_xy(n), batch_size=16, map_fn=_double, cache=prefix, shuffle=False)
    iterator = iter(ds)
    first = _ids([next(iterator)[1]])
    assert (tmp_path / "cache_0.lockfile").exists()  # the first pass is under way
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tfdata.pipeline(_xy(n), batch_size=16, map_fn=_double, cache=prefix, shuffle=False)
    assert (tmp_path / "cache_0.lockfile").exists()
    rest = _ids(y for _, y in iterator)
    assert first + rest == list(range(n))
    assert (tmp_path / "cache.index").is_file()  # the live first pass still completed


@pytest.mark.slow
def test_a_file_cache_killed_mid_first_pass_works_on_the_next_run(tmp_path):
    from tests.conftest import run_python

    prefix = tmp_path / "cache"
    killed = run_python(
        f"""
import os, signal
import numpy as np
import tensorflow as tf
from tfgpu import data as tfdata

n = 100_000  # unshuffled: only the prefetched batches pass the cache before the kill
ds = tfdata.pipeline((np.zeros((n, 4), np.float32), np.arange(n)), batch_size=16,
                     map_fn=lambda x, y: (x * 2, y), cache={str(prefix)!r}, shuffle=False)
iterator = iter(ds)
for _ in range(5):
    next(iterator)
os.kill(os.getpid(), signal.SIGKILL)
""",
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert "cache_0.lockfile" in _cache_leftovers(tmp_path)
    with pytest.warns(UserWarning, match=r"cache_0\.lockfile"):
        ds = tfdata.pipeline(_xy(), batch_size=16, map_fn=_Counter().decode, cache=prefix)
    assert sorted(_label_ids(ds)) == sorted(_label_ids(ds)) == list(range(N))
    assert (tmp_path / "cache.index").is_file()


def test_batch_augment_runs_on_whole_batches():
    seen = []

    def batch_aug(x, y):
        seen.append(x.shape.as_list())  # traced once with the batch shape
        return tf.reverse(x, axis=[0]), tf.reverse(y, axis=[0])

    ds = tfdata.pipeline(
        _xy(16), batch_size=8, shuffle=False, deterministic=True, batch_augment_fn=batch_aug
    )
    assert _label_ids(ds) == [*range(7, -1, -1), *range(15, 7, -1)]
    assert seen and seen[0][1:] == [4]


def test_repeat_gives_an_endless_dataset_reshuffled_per_pass():
    ds = tfdata.pipeline(_xy(8), batch_size=4, repeat=True, seed=1)
    ids = _ids(y for _, y in ds.take(6))
    passes = [ids[i : i + 8] for i in range(0, 24, 8)]
    assert all(sorted(p) == list(range(8)) for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_options_are_set_deliberately():
    ds = tfdata.pipeline(_xy(), batch_size=8, ram_budget_mib=256, private_threadpool_size=3)
    options = ds.options()
    assert options.autotune.enabled and options.autotune.ram_budget == 256 * 1024 * 1024
    assert options.experimental_optimization.map_parallelization
    assert options.experimental_optimization.map_fusion
    assert options.threading.private_threadpool_size == 3
    policy = tf.data.experimental.AutoShardPolicy
    assert options.experimental_distribute.auto_shard_policy == policy.DATA
    assert options.deterministic is False
    assert options.experimental_optimization.parallel_batch


def _graph_ops(ds) -> dict[str, tf.compat.v1.NodeDef]:
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    return {node.name: node for node in graph.node}


def test_augment_then_batch_stays_fusable_into_map_and_batch():
    """The batch after `augment_fn` is a plain batch fed straight by the parallel map, so
    tf.data fuses the two into MapAndBatchDataset. A `batch(num_parallel_calls=...)` there
    (ParallelBatchDataset) blocks that fusion and cost ~20% of the image benchmark's
    throughput; the `parallel_batch` option still parallelizes copies that are not fused."""
    ds = tfdata.pipeline(_xy(), batch_size=8, map_fn=lambda x, y: (x * 2.0, y), augment_fn=_noise)
    nodes = _graph_ops(ds)
    ops = [node.op for node in nodes.values()]
    assert "ParallelBatchDataset" not in ops
    (batch,) = [node for node in nodes.values() if node.op == "BatchDatasetV2"]
    producer = nodes[batch.input[0].split(":")[0]]
    assert producer.op == "ParallelMapDatasetV2"  # the augment_fn map, right before the batch
    assert ops.count("ParallelMapDatasetV2") == 2 and "CacheDatasetV2" in ops
    # still correct: every example once per epoch, a new augmentation every epoch
    first, second = list(ds), list(ds)
    assert sorted(_label_ids(first)) == sorted(_label_ids(second)) == list(range(N))
    x1 = np.concatenate([x for x, _ in first])
    assert x1.shape == (N, 4) and not np.array_equal(
        np.sort(x1, axis=0), np.sort(np.concatenate([x for x, _ in second]), axis=0)
    )


# ----------------------------------------------------------------------------- strategies, sharding


def test_drop_remainder_on_several_replicas_is_said_with_the_examples_dropped(mirrored):
    with pytest.warns(
        UserWarning,
        match=r"on 2 replicas the last partial batch is dropped by "
        r"default: 2 of 10 examples \(20\.0%\) every epoch.*drop_remainder=False",
    ):
        ds = tfdata.pipeline(_xy(10), batch_size=4, strategy=mirrored)
    assert ds.element_spec[0].shape.as_list() == [4, 4]  # static batch dimension
    assert [int(y.shape[0]) for _, y in ds] == [4, 4]
    with pytest.warns(UserWarning, match=r"4 of 10 examples \(40\.0%\).*global batch of 6"):
        per_replica = tfdata.pipeline(_xy(10), per_replica_batch_size=3, strategy=mirrored)
    assert [int(y.shape[0]) for _, y in per_replica] == [6]
    with warnings.catch_warnings():  # asked for, or nothing to drop: nothing to say
        warnings.simplefilter("error")
        kept = tfdata.pipeline(_xy(10), batch_size=4, strategy=mirrored, drop_remainder=False)
        assert sorted(_label_ids(kept)) == list(range(10))
        tfdata.pipeline(_xy(10), batch_size=4, strategy=mirrored, drop_remainder=True)
        tfdata.pipeline(_xy(12), batch_size=4, strategy=mirrored)
        tfdata.pipeline(_xy(10), batch_size=4, strategy=mirrored, repeat=True)


def test_one_replica_keeps_the_partial_batch_as_fit_does():
    """Issue 34: 63 examples, batches of 32 under a one-device strategy: all 63 every epoch
    (the partial batch was dropped in silence: 32 of 63)."""
    from tfgpu import strategy

    one = strategy("one_device", devices="/cpu:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = tfdata.pipeline(_xy(63), batch_size=32, strategy=one)
    assert sorted(_label_ids(ds)) == list(range(63))
    assert [int(y.shape[0]) for _, y in ds] == [32, 31]
    plan = _plan(_facts(replicas=1), has_strategy=True)
    assert plan.drop_remainder is False and plan.warnings == ()


def test_an_unshuffled_pipeline_under_a_strategy_keeps_every_example(mirrored):
    """`shuffle=False` is a validation or prediction pipeline: its partial batch is kept (Keras
    evaluates it under a strategy), as on the validation side of `validation_split`."""
    val = tfdata.pipeline(_xy(10), batch_size=4, strategy=mirrored, shuffle=False)
    assert _label_ids(val) == list(range(10))
    dist = mirrored.experimental_distribute_dataset(val)
    seen = [v for y in (b[1] for b in dist) for v in _ids(mirrored.experimental_local_results(y))]
    assert sorted(seen) == list(range(10))
    asked = tfdata.pipeline(
        _xy(10), batch_size=4, strategy=mirrored, shuffle=False, drop_remainder=True
    )
    assert _label_ids(asked) == list(range(8))
    few = tfdata.pipeline(_xy(3), batch_size=4, strategy=mirrored, shuffle=False)
    assert _label_ids(few) == [0, 1, 2]  # no "no batch at all" error: nothing is dropped
    assert _plan(_facts(replicas=2), has_strategy=True, shuffle=False).drop_remainder is False


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_each_example_seen_once_per_epoch_across_replicas(mirrored):
    dist = tfdata.pipeline(_xy(), per_replica_batch_size=4, strategy=mirrored, distribute=True)
    assert isinstance(dist, tf.distribute.DistributedDataset)
    for _ in range(2):
        seen = []
        for _, y in dist:
            parts = mirrored.experimental_local_results(y)
            assert [int(p.shape[0]) for p in parts] == [4, 4]
            seen += _ids(parts)
        assert sorted(seen) == list(range(N))


def _workers(make, workers=2):
    """What each worker of a multi-worker job iterates: its own pipeline, auto-sharded by
    TensorFlow with the policy the pipeline set (the rewrite `tf.distribute` applies)."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    return [_AutoShardDataset(make(), workers, i) for i in range(workers)]


def test_multi_worker_sharding_splits_in_memory_data_exactly(mirrored, monkeypatch):
    """Two workers, DATA policy: the pipeline is made deterministic and seeded so the shards
    partition every epoch, even with a shuffle and a parallel augmentation in between."""
    monkeypatch.setattr(_pipeline, "_worker_count", lambda strategy: 2)
    shards = _workers(
        lambda: tfdata.pipeline(_xy(), batch_size=8, strategy=mirrored, augment_fn=_noise)
    )
    orders = []
    for _ in range(2):  # each worker runs two epochs
        seen = [_label_ids(s) for s in shards]
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(N))
        orders.append(seen[0])
    assert orders[0] != orders[1]  # still reshuffled every epoch


def _write_tfrecords(directory, num_files=4, per_file=8) -> str:
    for f in range(num_files):
        with tf.io.TFRecordWriter(str(directory / f"part-{f}.tfrecord")) as w:
            for j in range(per_file):
                i = f * per_file + j
                feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                w.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
    return str(directory / "part-*.tfrecord")


def _parse(record):
    parsed = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return tf.cast(parsed["id"], tf.float32), parsed["id"]


def test_file_source_reads_all_files_shuffled_by_file(tmp_path):
    pattern = _write_tfrecords(tmp_path)
    ds = tfdata.pipeline(pattern, batch_size=5, map_fn=_parse, cache=False, seed=3)
    assert ds.options().experimental_distribute.auto_shard_policy == (
        tf.data.experimental.AutoShardPolicy.FILE
    )
    first, second = _label_ids(ds), _label_ids(ds)
    assert sorted(first) == sorted(second) == list(range(32))
    assert first != second
    in_order = tfdata.pipeline(
        [str(tmp_path / "part-1.tfrecord"), str(tmp_path / "part-0.tfrecord")],
        batch_size=4,
        map_fn=_parse,
        shuffle=False,
        deterministic=True,
    )
    # two files read in parallel (interleaved), order kept when deterministic
    assert sorted(_label_ids(in_order)) == list(range(16))


def test_file_source_is_sharded_by_file_across_workers(tmp_path, mirrored, monkeypatch):
    monkeypatch.setattr(_pipeline, "_worker_count", lambda strategy: 2)
    pattern = _write_tfrecords(tmp_path)
    make = lambda: tfdata.pipeline(pattern, batch_size=4, strategy=mirrored, map_fn=_parse)  # noqa: E731
    shards = [_label_ids(s) for s in _workers(make)]
    assert sorted(shards[0] + shards[1]) == list(range(32))
    files = [{i // 8 for i in s} for s in shards]  # each worker reads whole files
    assert not files[0] & files[1] and len(files[0]) == len(files[1]) == 2


def test_gzip_tfrecords(tmp_path):
    path = tmp_path / "z.tfrecord.gz"
    with tf.io.TFRecordWriter(str(path), options="GZIP") as w:
        for i in range(6):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            w.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    ds = tfdata.pipeline(str(path), batch_size=3, map_fn=_parse, compression_type="GZIP")
    assert sorted(_label_ids(ds)) == list(range(6))


def test_existing_dataset_source_keeps_its_randomness():
    source = tf.data.Dataset.range(20).map(lambda i: (tf.random.uniform(()), i))
    ds = tfdata.pipeline(source, batch_size=20, shuffle=False)
    a = next(iter(ds))[0].numpy()
    b = next(iter(ds))[0].numpy()
    assert not np.allclose(a, b)  # not cached: a dataset passed in may hold randomness
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.AUTO


# ----------------------------------------------------------------------------- pure decisions


def _facts(**kw) -> Facts:
    base = dict(
        kind="memory",
        num_examples=1000,
        element_bytes=16,
        num_files=None,
        has_map_fn=True,
        map_fn_random_ops=(),
        replicas=1,
        workers=1,
        on_gpu=False,
        cpu_count=8,
        ram_budget_bytes=1 << 30,
        free_disk_bytes=None,
    )
    return dataclasses.replace(Facts(**base), **kw)


def _plan(facts, **kw):
    args = dict(
        batch_size=32,
        per_replica_batch_size=None,
        cache="auto",
        shuffle=True,
        shuffle_buffer=None,
        drop_remainder=None,
        deterministic=None,
        seed=None,
        has_strategy=False,
        private_threadpool_size=None,
    )
    args.update(kw)
    return decide(facts, **args)


def test_decide_shuffle_buffer():
    assert _plan(_facts(num_examples=1000)).shuffle_buffer == 1000  # whole dataset, cached
    assert _plan(_facts(num_examples=10**7)).shuffle_buffer == 10_000
    arrays = _facts(num_examples=None, has_map_fn=False)  # in memory: cheap to fill
    assert _plan(arrays).shuffle_buffer == 10_000
    # 150 KB images with a 100 MiB budget: 10% of it holds ~69 images; never below a batch
    images = _facts(num_examples=10**6, element_bytes=150_528, ram_budget_bytes=100 << 20)
    assert _plan(images).shuffle_buffer == 69
    assert _plan(images, batch_size=128).shuffle_buffer == 128
    assert _plan(_facts(), shuffle=False).shuffle_buffer is None
    assert _plan(_facts(), shuffle_buffer=7).shuffle_buffer == 7


@pytest.mark.parametrize(
    "facts",
    [
        _facts(kind="files", num_examples=None, num_files=4),  # count unknown: not cached
        _facts(kind="files", num_examples=20_000, num_files=4, ram_budget_bytes=200_000),  # big
        _facts(num_examples=8000, map_fn_random_ops=("RandomUniform",)),  # random map_fn
        _facts(kind="dataset", num_examples=8000, has_map_fn=False),  # a dataset's own steps
    ],
)
def test_an_uncached_shuffle_holds_no_epoch(facts):
    """A shuffle yields nothing until its buffer is full: filled by work done every epoch,
    a whole epoch's buffer kept the model waiting while the epoch decoded (issue 27)."""
    plan = _plan(facts, batch_size=64)
    assert plan.cache is None and plan.shuffle_buffer == 1024
    assert _plan(facts, batch_size=2048).shuffle_buffer == 2048  # never below one batch
    assert _plan(facts, shuffle_buffer=5000).shuffle_buffer == 5000  # as asked


def test_a_dataset_that_reshuffles_itself_gets_no_buffer():
    loader = _facts(kind="dataset", num_examples=8000, has_map_fn=False, reshuffled=True)
    assert _plan(loader).shuffle_buffer is None  # a Keras loader reshuffles its file paths
    assert _plan(loader, shuffle_buffer=64).shuffle_buffer == 64
    cached = dataclasses.replace(loader, has_map_fn=True)  # cached after map_fn: one order
    assert _plan(cached).cache == "memory" and _plan(cached).shuffle_buffer == 8000


def test_decide_cache():
    assert _plan(_facts()).cache == "memory"  # decoded data fits
    assert _plan(_facts(has_map_fn=False)).cache is None  # arrays already in memory
    assert _plan(_facts(kind="dataset", has_map_fn=False)).cache is None
    assert _plan(_facts(kind="files", has_map_fn=False)).cache == "memory"
    assert _plan(_facts(element_bytes=None)).cache is None
    assert _plan(_facts(num_examples=-1)).cache is None
    random = _plan(_facts(map_fn_random_ops=("RandomUniform",)))
    assert random.cache is None and "random ops" in random.warnings[0]  # warned: user's fix
    assert not _plan(_facts(num_examples=-1)).warnings  # only noted: nothing to fix
    too_big = _facts(ram_budget_bytes=1000)
    assert _plan(too_big).cache is None
    with pytest.raises(ValueError, match="RAM budget"):
        _plan(too_big, cache="memory")
    with pytest.raises(ValueError, match="infinite"):
        _plan(_facts(num_examples=-1), cache=True)
    with pytest.raises(ValueError, match="free there"):
        _plan(_facts(free_disk_bytes=100), cache="/tmp/c")
    assert _plan(_facts(), cache=False).cache is None


def test_decide_batch_drop_remainder_sharding_threads():
    plan = _plan(_facts(replicas=4), per_replica_batch_size=16, batch_size=None)
    assert plan.global_batch_size == 64 and plan.drop_remainder is False
    two = _plan(_facts(replicas=2, num_examples=1000), has_strategy=True)
    assert two.drop_remainder is True
    assert two.warnings == (
        "on 2 replicas the last partial batch is dropped by default: 8 of 1000 examples (0.8%) "
        "every epoch, a global batch of 32; pass drop_remainder=False to keep it (Keras then "
        "splits it unevenly: each replica averages its own share), or drop_remainder=True to "
        "say you mean it",
    )
    unknown = _plan(_facts(replicas=2, num_examples=None), has_strategy=True)
    assert "(an unknown number of examples every epoch)" in unknown.warnings[0]
    assert _plan(_facts(), drop_remainder=True).drop_remainder is True
    assert _plan(_facts()).shard_policy == "DATA"
    assert _plan(_facts(kind="files", num_files=8, workers=4)).shard_policy == "FILE"
    few = _plan(_facts(kind="files", num_files=2, workers=4))
    assert few.shard_policy == "DATA" and few.deterministic and few.shuffle_seed == 0
    assert _plan(_facts(kind="dataset")).shard_policy == "AUTO"
    assert _plan(_facts(on_gpu=True)).private_threadpool_size == 8
    assert _plan(_facts(on_gpu=False)).private_threadpool_size == 0
    assert _plan(_facts(workers=2), seed=5).shuffle_seed == 5
    assert _plan(_facts()).deterministic is False


# ----------------------------------------------------------------------------- benchmark


def test_benchmark_counts_examples_and_restarts_short_datasets():
    ds = tfdata.pipeline(_xy(), batch_size=16, shuffle=False)  # 4 batches per epoch
    result = tfdata.benchmark(ds, steps=10, warmup=2)
    assert isinstance(result, tfdata.PipelineBenchmark)
    assert result.num_batches == 10 and result.num_examples == 160 and result.batch_size == 16
    assert result.epochs == 3  # 12 batches from a 4-batch dataset
    assert result.examples_per_s == pytest.approx(160 / result.seconds)
    assert result.batches_per_s == pytest.approx(10 / result.seconds)
    assert "examples/s" in str(result) and result.to_dict()["num_examples"] == 160
    ragged = tfdata.benchmark(tfdata.pipeline(_xy(20), batch_size=8), steps=6, warmup=0)
    assert ragged.batch_size is None and ragged.num_examples == 40  # 8, 8, 4, 8, 8, 4


def test_benchmark_says_how_busy_the_cpu_cores_were(monkeypatch):
    """CPU time over wall time x usable cores, over the timed batches only (scripted clocks:
    each wall-clock read advances 1 s, each CPU-time read 1.5 s; 2 cores)."""
    import types

    from tfgpu._internal.measure import reader

    wall, cpu = iter(range(0, 1000)), iter(x * 1.5 for x in range(1000))
    clock = types.SimpleNamespace(perf_counter=lambda: next(wall), process_time=lambda: next(cpu))
    monkeypatch.setattr(reader, "time", clock)
    monkeypatch.setattr(reader, "usable_cores", lambda: 2)
    result = tfdata.benchmark(tfdata.pipeline(_xy(), batch_size=16), steps=3, warmup=1)
    assert (result.cpu_busy, result.cpu_cores) == (0.75, 2)  # 1.5 CPU-s in 1 s on 2 cores
    assert str(result).endswith("; 75% of 2 CPU cores busy)")
    assert result.to_dict()["cpu_busy"] == 0.75


def test_benchmark_reads_a_short_dataset_through_one_iterator(monkeypatch):
    """A 4-batch dataset is not timed restarting every 4 batches (a new iterator, its
    buffers filling from empty: issue 16 saw it 4x slower than it is): the passes come from
    one iterator, as `data.repeat()` gives them, and are still counted."""
    from tensorflow.python.data.ops import iterator_ops

    made = []
    original = iterator_ops.OwnedIterator.__init__

    def counting_init(self, dataset=None, *args, **kwargs):
        if dataset is not None:  # not one rebuilt from its components by a tf.function
            made.append(1)
        original(self, dataset, *args, **kwargs)

    monkeypatch.setattr(iterator_ops.OwnedIterator, "__init__", counting_init)
    ds = tfdata.pipeline(_xy(), batch_size=16, shuffle=False)  # 4 batches per epoch
    result = tfdata.benchmark(ds, steps=50, warmup=5)
    assert len(made) == 1
    assert result.epochs == 14 and result.num_batches == 50 and result.num_examples == 800
    unknown = ds.filter(lambda x, y: True)  # a length TensorFlow cannot tell
    made.clear()
    assert tfdata.benchmark(unknown, steps=9, warmup=0).epochs == 3 and len(made) == 1


@pytest.mark.slow
def test_benchmark_measures_a_slow_pipeline_as_slow():
    # A lower bound only: each element sleeps 20 ms in a sequential map, and sleeping is never
    # shorter on a loaded machine. At most two elements can be ready before timing starts.
    def slow(i):
        time.sleep(0.02)
        return i

    ds = tf.data.Dataset.range(10).map(lambda i: tf.py_function(slow, [i], tf.int64)).batch(1)
    result = tfdata.benchmark(ds, steps=5, warmup=0)
    assert result.seconds >= 3 * 0.02
    assert result.batches_per_s <= 5 / (3 * 0.02)


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_benchmark_of_a_distributed_dataset(mirrored):
    dist = tfdata.pipeline(_xy(), per_replica_batch_size=4, strategy=mirrored, distribute=True)
    result = tfdata.benchmark(dist, steps=4, warmup=1)
    assert result.batch_size == 8 and result.num_examples == 32


def test_benchmark_pulls_batches_inside_tensorflow_not_through_python_next(monkeypatch):
    """What is timed is the pipeline, not Python wrapping each batch in eager tensors.

    (How much that matters is measured in `benchmarks/data_pipeline.py`.)
    """
    from tensorflow.python.data.ops import iterator_ops

    calls = []
    original = iterator_ops.OwnedIterator.__next__

    def counting_next(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(iterator_ops.OwnedIterator, "__next__", counting_next)
    x, y = _xy()
    ds = tfdata.pipeline({"x": x, "y": y}, batch_size=2, shuffle=False, repeat=True)
    result = tfdata.benchmark(ds, steps=300, warmup=20)
    assert result.num_batches == 300 and result.num_examples == 600
    assert calls == []


def test_benchmark_counts_ragged_sparse_and_unbatched_elements():
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3], [], [4]]))
    result = tfdata.benchmark(ragged.batch(3), steps=2, warmup=0)
    assert result.num_examples == 4 and result.batch_size is None  # 3, 1
    sparse = tf.data.Dataset.from_tensors(tf.sparse.eye(5)).repeat(3)
    assert tfdata.benchmark(sparse, steps=3, warmup=0).num_examples == 15
    scalars = tfdata.benchmark(tf.data.Dataset.range(4), steps=6, warmup=1)
    assert scalars.num_examples == 6 and scalars.batch_size == 1 and scalars.epochs == 2


def _stalling(release: threading.Event, first: int) -> tf.data.Dataset:
    """Yields `first` batches, then waits (without using a CPU) until `release` is set."""

    def examples():
        yield from range(first)
        release.wait()

    spec = tf.TensorSpec([], tf.int64)
    return tf.data.Dataset.from_generator(examples, output_signature=spec).batch(1)


@pytest.mark.parametrize("first", [0, 2])
def test_benchmark_of_a_dataset_that_stops_yielding_raises_instead_of_hanging(first):
    """Whether the dataset never yields or stops after some batches, `benchmark` gives up
    after `timeout_s` without a batch. What is checked is that it returns at all, not when."""
    release = threading.Event()
    try:
        with pytest.raises(
            TimeoutError, match=r"No element from `data` in 0\.1 s \(after \d+ batches\)"
        ):
            tfdata.benchmark(_stalling(release, first), steps=5, warmup=0, timeout_s=0.1)
    finally:
        release.set()  # the reading thread ends with the dataset


@pytest.mark.slow
def test_benchmark_of_a_filter_that_nothing_passes_raises():
    """The issue's dataset: a `filter` over an endless `range` spins for ever without yielding,
    so it runs in a child process, whose spinning reader ends with it."""
    from tests.conftest import run_python

    done = run_python(
        """
import tensorflow as tf
from tfgpu import data as tfdata

ds = tf.data.Dataset.range(8).repeat().filter(lambda v: v > 100)
try:
    tfdata.benchmark(ds, timeout_s=0.5)
except TimeoutError as e:
    print("raised:", e)
""",
        check=False,
    )
    assert "raised: No element from `data` in 0.5 s" in done.stdout, done.stderr[-2000:]


def test_benchmark_bad_input():
    ds = tf.data.Dataset.range(4).batch(2)
    with pytest.raises(TypeError, match=r"argument `data`. Received: data of type list"):
        tfdata.benchmark([1, 2, 3])
    with pytest.raises(ValueError, match=r"argument `steps`. Received: steps=0"):
        tfdata.benchmark(ds, steps=0)
    with pytest.raises(ValueError, match="`warmup`"):
        tfdata.benchmark(ds, warmup=-1)
    with pytest.raises(ValueError, match="0 batches"):
        tfdata.benchmark(tf.data.Dataset.range(3).batch(4, drop_remainder=True))
    with pytest.raises(ValueError, match="yields no batches"):
        tfdata.benchmark(tf.data.Dataset.range(3).filter(lambda i: i > 5))
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"argument `timeout_s`. Received: timeout_s="):
            tfdata.benchmark(ds, timeout_s=bad)
    with pytest.raises(TypeError, match=r"argument `timeout_s`"):
        tfdata.benchmark(ds, timeout_s="60")


# ----------------------------------------------------------------------------- benchmark script


@pytest.mark.slow
def test_benchmark_script_runs_quick():
    import subprocess

    from tests.conftest import REPO

    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "data_pipeline.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "tfgpu/naive" in out and "feed ratio" in out and "small CNN" in out
    assert "tfgpu/best hand-tuned (" in out and "goal tfgpu/best >= 0.97:" in out


@pytest.mark.slow
def test_keras_fit_consumes_the_pipeline_under_a_strategy(mirrored):
    import keras

    seen = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    x, y = _xy()
    ds = tfdata.pipeline(
        (x, (y % 2).astype("float32")), per_replica_batch_size=4, strategy=mirrored
    )
    with mirrored.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    history = model.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=[Count()])
    assert len(history.history["loss"]) == 2
    assert seen == list(range(8)) * 2  # 64 examples / global batch 8, every epoch


# ----------------------------------------------------------------------------- hostile input


def test_numeric_arguments_follow_one_rule():
    x, y = _xy(16)
    ds = tfdata.pipeline((x, y), batch_size=np.int64(8), seed=np.int32(3), shuffle_buffer=8)
    assert sorted(_label_ids(ds)) == list(range(16))  # NumPy integers are integers
    with pytest.raises(ValueError, match=r"`ram_budget_mib`. Received: ram_budget_mib=inf"):
        tfdata.pipeline((x, y), batch_size=8, ram_budget_mib=float("inf"))
    with pytest.raises(ValueError, match=r"ram_budget_mib=nan"):
        tfdata.pipeline((x, y), batch_size=8, ram_budget_mib=float("nan"))
    with pytest.raises(TypeError, match=r"ram_budget_mib='64'"):
        tfdata.pipeline((x, y), batch_size=8, ram_budget_mib="64")
    assert tfdata.pipeline((x, y), batch_size=8, ram_budget_mib=np.float32(64)) is not None
    with pytest.raises(TypeError, match=r"`shuffle_buffer`.*nan"):
        tfdata.pipeline((x, y), batch_size=8, shuffle_buffer=float("nan"))
    with pytest.raises(ValueError, match=r"`seed`. Received: seed=-1"):
        tfdata.pipeline((x, y), batch_size=8, seed=-1)
    with pytest.raises(TypeError, match=r"`seed`"):
        tfdata.pipeline((x, y), batch_size=8, seed=1.5)
    with pytest.raises(TypeError, match=r"`private_threadpool_size`"):
        tfdata.pipeline((x, y), batch_size=8, private_threadpool_size=2.0)
    with pytest.raises(TypeError, match=r"`compression_type`"):
        tfdata.pipeline((x, y), batch_size=8, compression_type=1)
    with pytest.raises(TypeError, match=r"`strategy`.*pass an instance"):
        tfdata.pipeline((x, y), batch_size=8, strategy=tf.distribute.MirroredStrategy)


def test_paths_are_checked_before_work(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"`cache`.*under the file .*file.txt"):
        tfdata.pipeline(_xy(), batch_size=8, cache=str(a_file / "cache"))
    with pytest.raises(ValueError, match=r"`cache`.*is a directory.*train-cache"):
        tfdata.pipeline(_xy(), batch_size=8, cache=tmp_path)
    with pytest.raises(ValueError, match=r"`data`.*is a directory.*\*\.tfrecord"):
        tfdata.pipeline(str(tmp_path), batch_size=8)
    with pytest.raises(ValueError, match=r"`data`. Received: data=''"):
        tfdata.pipeline("", batch_size=8)
    with pytest.raises(FileNotFoundError, match=r"match no files: \['.*nothing-\*'\]"):
        tfdata.pipeline([str(a_file), str(tmp_path / "nothing-*")], batch_size=8)
    with pytest.raises(ValueError, match=r"`data_dir`.*is a file"):
        tfdata.pipeline("mnist", batch_size=8, data_dir=a_file)
    with pytest.raises(ValueError, match=r"`data_dir`.*is a file"):
        tfdata.load_tfds("mnist", data_dir=a_file)
    with pytest.raises(ValueError, match=r"`seed`"):
        tfdata.load_tfds("mnist", seed=-2)
    with pytest.raises(TypeError, match=r"`with_info`"):
        tfdata.load_tfds("mnist", with_info="yes")
    with pytest.raises(ValueError, match=r"`split`. Received: split=''"):
        tfdata.load_tfds("mnist", split="")


def test_compression_that_contradicts_the_files_is_named(tmp_path):
    plain, zipped = str(tmp_path / "plain.tfrecord"), str(tmp_path / "zipped.tfrecord")
    with tf.io.TFRecordWriter(plain) as w:
        w.write(b"record")
    with tf.io.TFRecordWriter(zipped, options="GZIP") as w:
        w.write(b"record")
    with pytest.raises(ValueError, match=r"zipped.tfrecord' is GZIP.*compression_type='GZIP'"):
        tfdata.pipeline(zipped, batch_size=1)
    with pytest.raises(ValueError, match=r"plain.tfrecord' is not compressed.*=None"):
        tfdata.pipeline(plain, batch_size=1, compression_type="GZIP")
    assert [b.numpy().tolist() for b in tfdata.pipeline(plain, batch_size=1)] == [[b"record"]]


def test_hostile_memory_sources():
    x, y = _xy(6)
    with pytest.raises(TypeError, match=r"a list of arrays.*tuple of arrays"):
        tfdata.pipeline([x, y], batch_size=2)
    with pytest.raises(TypeError, match=r"keys \[1\].*str keys"):
        tfdata.pipeline({1: x}, batch_size=2)
    with pytest.raises(TypeError, match=r"Python objects.*holding a dict"):
        tfdata.pipeline(np.array([{}, 1], dtype=object), batch_size=2)
    with pytest.raises(ValueError, match=r"different lengths.*\['x'\] has 6, data\['y'\] has 5"):
        tfdata.pipeline({"x": x, "y": y[:5]}, batch_size=2)
    # strings, ragged lists and ragged tensors are data, as are (x, y, sample_weight)
    text = tfdata.pipeline(np.array(["a", "bb", "ccc"]), batch_size=3, shuffle=False)
    assert next(iter(text)).numpy().tolist() == [b"a", b"bb", b"ccc"]
    ragged = tfdata.pipeline([[1, 2], [3], [4, 5, 6]], batch_size=3, shuffle=False)
    assert next(iter(ragged)).to_list() == [[1, 2], [3], [4, 5, 6]]
    rt = tfdata.pipeline(tf.ragged.constant([[1], [2, 3]]), batch_size=2, shuffle=False)
    assert next(iter(rt)).to_list() == [[1], [2, 3]]
    weighted = tfdata.pipeline((x, y, np.ones(6)), batch_size=6, map_fn=lambda a, b, w: (a, b, w))
    assert [t.shape[0] for t in next(iter(weighted))] == [6, 6, 6]


def test_fewer_examples_than_one_global_batch_is_an_error(mirrored):
    x, y = _xy(6)
    with pytest.raises(
        ValueError,
        match=r"`per_replica_batch_size`. Received: per_replica_batch_size=4, a global batch of "
        r"8 \(4 per replica x 2 replicas\), but the source has only 6 examples.*no batch",
    ):
        tfdata.pipeline((x, y), per_replica_batch_size=4, strategy=mirrored)
    with pytest.raises(ValueError, match=r"batch_size=8.*only 3 examples.*drop_remainder=False"):
        tfdata.pipeline(tf.data.Dataset.range(3), batch_size=8, drop_remainder=True)
    with pytest.raises(ValueError, match=r"0 elements"):
        tfdata.pipeline(tf.data.Dataset.range(0), batch_size=8)
    # a partial batch kept, or a repeated source, still yields batches
    assert [int(b.shape[0]) for b in tfdata.pipeline(tf.data.Dataset.range(3), batch_size=8)] == [3]
    endless = tfdata.pipeline((x, y), per_replica_batch_size=4, strategy=mirrored, repeat=True)
    assert next(iter(endless))[0].shape[0] == 8


@pytest.mark.slow
def test_function_arity_is_checked_against_the_elements():
    x, y = _xy(8)
    with pytest.raises(TypeError, match=r"`map_fn`.*\(x\).*2 positional.*map_fn\(c0, c1\)"):
        tfdata.pipeline((x, y), batch_size=4, map_fn=lambda x: x)
    with pytest.raises(TypeError, match=r"`augment_fn`.*\(x, y, w\).*after `map_fn`"):
        tfdata.pipeline((x, y), batch_size=4, augment_fn=lambda x, y, w: (x, y))
    with pytest.raises(TypeError, match=r"`batch_augment_fn`.*on a batch"):
        tfdata.pipeline((x, y), batch_size=4, batch_augment_fn=lambda b: b)
    with pytest.raises(TypeError, match=r"`map_fn`.*map_fn\(dict\).*'a': TensorSpec"):
        tfdata.pipeline({"a": x, "b": y}, batch_size=4, map_fn=lambda a, b: a)
    with pytest.raises(TypeError, match=r"`map_fn`.*\(\).*1 positional.*element"):
        tfdata.pipeline(x, batch_size=4, map_fn=lambda: 1)
    # callables with unreadable or open signatures still work: tf.function, Keras layers
    doubled = tfdata.pipeline(x, batch_size=8, shuffle=False, map_fn=tf.function(lambda a: 2 * a))
    assert float(next(iter(doubled))[1, 0]) == 2.0
    import keras

    vectorize = keras.layers.TextVectorization(output_sequence_length=2)
    vectorize.adapt(["a b", "b c"])
    text = tfdata.pipeline(np.array(["a b", "c"]), batch_size=2, map_fn=vectorize)
    assert next(iter(text)).shape == (2, 2)


def test_errors_while_tracing_a_function_name_it():
    x, y = _xy(8)
    with pytest.raises(ValueError) as error:
        tfdata.pipeline((x, y), batch_size=4, map_fn=lambda x, y: (tf.linalg.matmul(x, x), y))
    assert "raised while tracing `map_fn`" in "".join(error.value.__notes__)


def test_benchmark_of_hostile_datasets():
    with pytest.raises(TypeError, match=r"`steps`.*2.5"):
        tfdata.benchmark(tf.data.Dataset.range(4).batch(2), steps=2.5)
    with pytest.raises(ValueError, match="0 batches"):
        tfdata.benchmark(tf.data.Dataset.range(0))
    endless = tfdata.benchmark(tf.data.Dataset.range(3).repeat().batch(2), steps=3)
    assert endless.num_batches == 3 and endless.epochs == 1  # bounded by steps
    assert tfdata.benchmark(tf.data.Dataset.range(4), steps=np.int64(2)).num_batches == 2


# ----------------------------------------------------------------------------- batched sources


def _sizes(ds) -> list[int]:
    return [int(tf.nest.flatten(b)[0].shape[0]) for b in ds]


def _variable_images():
    sides = tf.data.Dataset.from_tensor_slices(np.array([2, 3, 4], np.int32))
    return sides.map(lambda n: (tf.zeros((n, n, 3)), n))


@pytest.mark.parametrize(
    "make, batched",
    [
        (lambda: tf.data.Dataset.range(20).batch(8).prefetch(1), True),
        (lambda: tf.data.Dataset.range(20).batch(8).map(lambda b: b * 2), True),
        (
            lambda: (
                tf.data.Dataset.range(20)
                .batch(8)
                .cache()
                .shuffle(2)
                .with_options(tf.data.Options())
            ),
            True,
        ),
        (lambda: tf.data.Dataset.range(20).map(lambda i: tf.range(i % 3)).padded_batch(8), True),
        (lambda: tf.data.Dataset.range(20).batch(8, drop_remainder=True), True),
        (lambda: tf.data.Dataset.range(20).batch(8).unbatch(), False),
        (lambda: tf.data.Dataset.range(20).batch(8).map(lambda b: tf.reduce_sum(b)), False),
        (lambda: tf.data.Dataset.range(20).map(lambda i: tf.range(i % 3 + 1)), False),
        (_variable_images, False),
    ],
    ids=[
        "prefetch",
        "map",
        "cache-shuffle-options",
        "padded",
        "drop",
        "unbatch",
        "reduced",
        "sequences",
        "variable-images",
    ],
)
def test_batched_sources_are_detected_from_chain_and_spec(make, batched):
    found, ambiguous = source_batches(make())
    assert (found is not None) is batched and not ambiguous


@pytest.mark.slow
def test_a_batched_source_is_rebatched_never_batched_twice():
    source = tf.data.Dataset.range(20).batch(8).prefetch(1)  # 8, 8, 4
    kept = tfdata.pipeline(source, batch_size=None)
    assert _sizes(kept) == [8, 8, 4] and sorted(_ids(kept)) == list(range(20))
    assert _sizes(tfdata.pipeline(source, batch_size=8)) == [8, 8, 4]  # same size: kept
    rebatched = tfdata.pipeline(source, batch_size=5)
    assert int(rebatched.cardinality()) == 4  # unbatch forgets the count; restored
    assert _sizes(rebatched) == [5] * 4 and sorted(_ids(rebatched)) == list(range(20))
    dropped = tfdata.pipeline(source, batch_size=6, drop_remainder=True)
    assert int(dropped.cardinality()) == 3 and _sizes(dropped) == [6, 6, 6]
    mapped = tfdata.pipeline(source, batch_size=None, map_fn=lambda i: i + 100, shuffle=False)
    assert _sizes(mapped) == [8, 8, 4] and _ids(mapped) == list(range(100, 120))
    unknown = tf.data.Dataset.range(20).batch(8).filter(lambda b: True)
    with pytest.warns(UserWarning, match="cardinality is unknown"):
        rebatched = tfdata.pipeline(unknown, batch_size=10)
    assert _sizes(rebatched) == [10, 10]
    with pytest.raises(ValueError, match=r"batches of 3, which do not split evenly.*batch_size=2"):
        tfdata.pipeline(tf.data.Dataset.range(9).batch(3), batch_size=None, strategy=_TwoReplicas())


def test_a_dataset_unbatched_by_the_user_gets_its_count_back():
    """`loader.unbatch()` forgets the count (Keras shows no step count); the pipeline restores
    it when the batches' examples are known and only one-for-one steps follow the unbatch."""
    batches = tf.data.Dataset.range(20).batch(8)  # 8, 8, 4
    for examples in (batches.unbatch(), batches.unbatch().map(lambda i: i * 2).prefetch(1)):
        assert int(examples.cardinality()) == tf.data.UNKNOWN_CARDINALITY
        ds = tfdata.pipeline(examples, batch_size=5, shuffle=False)
        assert int(ds.cardinality()) == 4 and _sizes(ds) == [5] * 4
    kept = tf.data.Dataset.range(20).batch(8).unbatch().filter(lambda i: i < 5)  # count lost
    assert int(tfdata.pipeline(kept, batch_size=5).cardinality()) == tf.data.UNKNOWN_CARDINALITY
    train, val = tfdata.pipeline(batches.unbatch(), batch_size=5, validation_split=0.25)
    assert int(train.cardinality()) == 3 and sum(_sizes(val)) == 5  # countable: splittable


class _TwoReplicas(tf.distribute.OneDeviceStrategy):
    """A strategy that reports 2 replicas, for the pure checks (no graph work)."""

    def __init__(self):
        super().__init__("/cpu:0")

    @property
    def num_replicas_in_sync(self):
        return 2


def test_keras_image_loader_dataset(tmp_path):
    import keras
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(5):
            Image.fromarray(np.full((6, 6, 3), i, np.uint8)).save(tmp_path / label / f"{i}.png")
    batched = keras.utils.image_dataset_from_directory(
        tmp_path, batch_size=4, image_size=(6, 6), verbose=False
    )
    assert _sizes(tfdata.pipeline(batched, batch_size=None)) == [4, 4, 2]
    rebatched = tfdata.pipeline(batched, batch_size=8, augment_fn=lambda x, y: (x + 1, y))
    assert int(rebatched.cardinality()) == 2 and _sizes(rebatched) == [8, 2]
    images, labels = next(iter(rebatched))
    assert images.shape == (8, 6, 6, 3) and labels.shape == (8,)  # not batches of batches
    examples = keras.utils.image_dataset_from_directory(
        tmp_path, batch_size=None, image_size=(6, 6), verbose=False
    )
    clean = tfdata.pipeline(examples, batch_size=4)
    assert int(clean.cardinality()) == 3 and _sizes(clean) == [4, 4, 2]


def test_a_dataset_of_batches_of_unknown_origin_is_ambiguous():
    def batches():
        yield np.zeros((2, 3), np.float32), np.zeros(2, np.float32)

    spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.float32))
    source = tf.data.Dataset.from_generator(batches, output_signature=spec)
    with pytest.warns(UserWarning, match="cannot tell whether"):
        tfdata.pipeline(source, batch_size=2)


def test_each_warning_points_at_the_line_that_called_pipeline(tmp_path):
    # The warnings are raised a few calls deep inside the package; each must still name the
    # caller's file and line, where the fix belongs.
    def random_decode(x, y):
        return x + tf.random.uniform((4,)), y

    def unsized(x, y):  # examples of unknown size: a batch cannot stack them
        return tf.zeros(tf.stack([y % 2 + 1])), y

    def batches():
        yield np.zeros((2, 3), np.float32), np.zeros(2, np.float32)

    spec = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None,), tf.float32))
    (tmp_path / "cache_0.lockfile").write_text("Created at: 1700000000")
    with pytest.warns(UserWarning) as record:
        tfdata.pipeline(_xy(), batch_size=16, map_fn=random_decode)  # random ops: not cached
        tfdata.pipeline(_xy(), batch_size=16, map_fn=unsized)  # unknown size
        tfdata.pipeline(_xy(), batch_size=16, cache=tmp_path / "cache")  # interrupted cache
        tfdata.pipeline(
            tf.data.Dataset.from_generator(batches, output_signature=spec), batch_size=2
        )
        filtered = tf.data.Dataset.range(20).filter(lambda i: i >= 0).batch(4)
        tfdata.pipeline(filtered, batch_size=2)  # rebatched, count unknown
    messages = [str(w.message) for w in record]
    for expected in ("random ops", "unknown size", "interrupted", "cannot tell", "is unknown"):
        assert any(expected in m for m in messages), (expected, messages)
    assert {(w.filename, w.message.__class__) for w in record} == {(__file__, UserWarning)}


# ----------------------------------------------------------------- validation_split, batch_map_fn


def test_validation_split_of_arrays_is_the_last_fraction_taken_before_shuffling():
    train, val = tfdata.pipeline(_xy(20), batch_size=4, validation_split=0.25, augment_fn=_noise)
    assert int(train.cardinality()) == 4 and int(val.cardinality()) == 2
    first, second = _label_ids(train), _label_ids(train)
    assert sorted(first) == sorted(second) == list(range(15)) and first != second
    assert _label_ids(val) == _label_ids(val) == list(range(15, 20))  # Keras fit's split
    x, y = next(iter(val))
    np.testing.assert_array_equal(x[:, 0], y)  # not augmented
    assert made_by_pipeline(train) and made_by_pipeline(val)
    train_only = tfdata.pipeline(_xy(20), batch_size=4)
    assert isinstance(train_only, tf.data.Dataset)  # without the split: one dataset, as before


def test_the_returned_dataset_carries_the_call_arguments():
    """A plain attribute, as Keras's `class_names`: on what pipeline returns, nowhere else."""
    source = tf.data.Dataset.from_tensor_slices(_xy(20))
    train, val = tfdata.pipeline(source, batch_size=4, validation_split=0.25, shuffle=False)
    arguments = train.pipeline_arguments
    assert arguments["data"] is source and arguments["batch_size"] == 4
    assert set(arguments) == set(inspect.signature(tfdata.pipeline).parameters)
    assert val.pipeline_arguments is None  # no call returns the validation side alone
    assert not hasattr(source, "pipeline_arguments")  # the user's dataset is left alone
    assert pipeline_arguments(train) == arguments and pipeline_arguments(train) is not arguments
    assert pipeline_arguments(train.repeat()) is None and made_by_pipeline(train.repeat())
    assert pipeline_arguments(val) is None and made_by_pipeline(val)
    assert not made_by_pipeline(source) and pipeline_arguments(source) is None
    again, _ = tfdata.pipeline(**{**arguments, "batch_size": 5})  # what `tune` does
    assert [int(x.shape[0]) for x, _ in again] == [5, 5, 5]


@pytest.mark.parametrize(
    "bad, error",
    [
        (0, ValueError),
        (1, ValueError),
        (0.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (-0.5, ValueError),
        (1.5, ValueError),
        (True, TypeError),
        ("0.1", TypeError),
        ([0.1], TypeError),
    ],
)
def test_validation_split_must_be_a_fraction(bad, error):
    with pytest.raises(error, match=r"argument `validation_split`.*Expected a float in \(0, 1\)"):
        tfdata.pipeline(_xy(20), batch_size=4, validation_split=bad)


def test_validation_split_counts_are_checked_before_work(mirrored):
    _, val = tfdata.pipeline(_xy(20), batch_size=4, validation_split=np.float32(0.2))
    assert _label_ids(val) == [16, 17, 18, 19]
    with pytest.raises(ValueError, match=r"of 5 examples gives 0 for training and 5 for valid"):
        tfdata.pipeline(_xy(5), batch_size=1, validation_split=0.9)
    with pytest.raises(
        ValueError,
        match=r"gives 18 for training and 2 for validation.*global "
        r"batch of 4, so validation \(2 examples\) would yield no batch",
    ):
        tfdata.pipeline(
            _xy(20), batch_size=4, strategy=mirrored, validation_split=0.1, drop_remainder=True
        )
    # drop_remainder left to the strategy's default: the validation side keeps partial batches
    _, val = tfdata.pipeline(_xy(20), batch_size=4, strategy=mirrored, validation_split=0.1)
    assert int(val.cardinality()) == 1 and _label_ids(val) == [18, 19]


def test_validation_split_of_a_single_example_asks_for_two():
    for source in (_xy(1), tf.data.Dataset.from_tensor_slices(_xy(1))):
        for split in (0.5, 0.01, 0.99):
            with pytest.raises(
                ValueError, match=r"of 1 examples gives .*Expected a source of at least 2 examples"
            ) as raised:
                tfdata.pipeline(source, batch_size=1, validation_split=split)
            assert "between 1 and 0" not in str(raised.value)


def _ordered(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda i: (tf.cast(i, tf.float32), i))


@pytest.mark.parametrize(
    "source, step",
    [
        (
            lambda: _ordered(tf.data.Dataset.range(20)).map(
                lambda x, y: (x, y), num_parallel_calls=2, deterministic=False
            ),
            "ParallelMapDataset",
        ),
        (  # upstream of other steps, the loader's own parallel map
            lambda: (
                tf.data.Dataset.range(20)
                .map(lambda i: i * 1, num_parallel_calls=2, deterministic=False)
                .map(lambda i: (tf.cast(i, tf.float32), i))
                .prefetch(2)
            ),
            "ParallelMapDataset",
        ),
        (  # a batched source, unbatched by the pipeline
            lambda: _ordered(tf.data.Dataset.range(20)).batch(
                4, num_parallel_calls=2, deterministic=False
            ),
            "ParallelBatchDataset",
        ),
        (  # the flag lives only in the op's attributes
            lambda: _ordered(
                tf.data.Dataset.range(4).interleave(
                    lambda i: tf.data.Dataset.range(5).map(lambda v: v + 5 * i),
                    cycle_length=2,
                    num_parallel_calls=2,
                    deterministic=False,
                )
            ).apply(tf.data.experimental.assert_cardinality(20)),
            "ParallelInterleaveDataset",
        ),
        (  # one input of a zip
            lambda: tf.data.Dataset.zip(
                (
                    tf.data.Dataset.range(20).map(
                        lambda i: tf.cast(i, tf.float32), num_parallel_calls=2, deterministic=False
                    ),
                    tf.data.Dataset.range(20),
                )
            ),
            "ParallelMapDataset",
        ),
    ],
)
@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_validation_split_of_a_dataset_with_an_unordered_step_is_refused(source, step):
    """Which examples come last would change every pass: some validation examples trained
    on, as many never seen. The pipeline's deterministic=True does not reach such a step."""
    with pytest.raises(
        ValueError,
        match=rf"validation_split=0.25 for a `tf.data.Dataset` with a step that runs out of "
        rf"order \({step}\(deterministic=False\)\).*Remove that step's deterministic=False",
    ):
        tfdata.pipeline(source(), batch_size=4, validation_split=0.25)


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_validation_split_of_a_dataset_with_ordered_parallel_steps_is_accepted():
    options = tf.data.Options()
    options.deterministic = False  # overridden by the pipeline's own deterministic=True
    for source in (
        _ordered(tf.data.Dataset.range(20)).map(
            lambda x, y: (x, y), num_parallel_calls=2, deterministic=True
        ),
        _ordered(tf.data.Dataset.range(20)).map(lambda x, y: (x, y), num_parallel_calls=2),
        _ordered(tf.data.Dataset.range(20))
        .map(lambda x, y: (x, y), num_parallel_calls=2)
        .with_options(options),
    ):
        _, val = tfdata.pipeline(source, batch_size=4, validation_split=0.25)
        assert _label_ids(val) == list(range(15, 20))


@pytest.mark.slow
def test_validation_split_of_a_dataset_takes_its_last_examples():
    source = tf.data.Dataset.range(20).map(lambda i: (tf.cast(i, tf.float32), i))
    train, val = tfdata.pipeline(source, batch_size=4, validation_split=0.25)
    assert sorted(_label_ids(train)) == list(range(15))
    assert _label_ids(val) == list(range(15, 20))
    batched = source.batch(6)  # a loader's batches: unbatched, split, batched again
    train, val = tfdata.pipeline(batched, validation_split=0.25)
    assert [int(tf.size(y)) for _, y in train] == [6, 6, 3] and _label_ids(val) == [
        15,
        16,
        17,
        18,
        19,
    ]
    with pytest.raises(ValueError, match=r"number of examples is unknown.*subset=\"both\""):
        tfdata.pipeline(source.filter(lambda x, y: True), batch_size=4, validation_split=0.2)
    with pytest.raises(ValueError, match="infinite"):
        tfdata.pipeline(source.repeat(), batch_size=4, validation_split=0.2)
    with pytest.raises(ValueError, match=r"reshuffles its examples every pass.*shuffle=False"):
        tfdata.pipeline(source.shuffle(20), batch_size=4, validation_split=0.2)
    fixed = source.shuffle(20, seed=1, reshuffle_each_iteration=False)  # same order every pass
    _, val = tfdata.pipeline(fixed, batch_size=4, validation_split=0.25)
    assert _label_ids(val) == _label_ids(val) == [int(i) for _, i in fixed][15:]
    with pytest.raises(ValueError, match=r"Conflicting arguments: deterministic=False and "):
        tfdata.pipeline(source, batch_size=4, validation_split=0.2, deterministic=False)


@pytest.mark.slow
def test_validation_split_of_tfrecords_is_by_record_hash(tmp_path, mirrored, monkeypatch):
    pattern = _write_tfrecords(tmp_path)  # 4 files of 8 records, ids 0..31
    train, val = tfdata.pipeline(pattern, batch_size=4, map_fn=_parse, validation_split=0.25)
    train_ids, val_ids = _label_ids(train), _label_ids(val)
    assert sorted(train_ids + val_ids) == list(range(32)) and 0 < len(val_ids) < 32
    assert sorted(_label_ids(train)) == sorted(train_ids) and _label_ids(val) == val_ids
    files = sorted(tmp_path.glob("part-*.tfrecord"), reverse=True)  # another file order
    _, val_again = tfdata.pipeline(
        [str(f) for f in files], batch_size=4, map_fn=_parse, validation_split=0.25
    )
    assert sorted(_label_ids(val_again)) == sorted(val_ids)
    monkeypatch.setattr(_pipeline, "_worker_count", lambda strategy: 2)
    make = lambda: tfdata.pipeline(  # noqa: E731
        pattern,
        batch_size=2,
        strategy=mirrored,
        map_fn=_parse,
        validation_split=0.25,
        drop_remainder=False,
    )
    shards = [_validation_shard(make(), 2, i) for i in range(2)]
    seen = [_label_ids(s) for s in shards]
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == sorted(val_ids)


def _validation_shard(pair, workers, index):
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    return _AutoShardDataset(pair[1], workers, index)


def test_validation_split_of_in_memory_data_is_sharded_across_workers(mirrored, monkeypatch):
    monkeypatch.setattr(_pipeline, "_worker_count", lambda strategy: 2)
    make = lambda: tfdata.pipeline(  # noqa: E731
        _xy(40), batch_size=4, strategy=mirrored, validation_split=0.2
    )
    seen = [_label_ids(_validation_shard(make(), 2, i)) for i in range(2)]
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(32, 40))


def test_validation_side_is_cached_not_repeated_and_distributed_too(tmp_path, mirrored):
    counter = _Counter()
    train, val = tfdata.pipeline(
        _xy(20), batch_size=4, map_fn=counter.decode, cache="memory", validation_split=0.2
    )
    for _ in range(2):
        _label_ids(train), _label_ids(val)
    assert counter.calls == 20  # each example decoded once, on both sides
    prefix = tmp_path / "cache"
    train, val = tfdata.pipeline(_xy(20), batch_size=4, cache=str(prefix), validation_split=0.2)
    _label_ids(train), _label_ids(val)
    assert (tmp_path / "cache.index").is_file() and (tmp_path / "cache-validation.index").is_file()
    train, val = tfdata.pipeline(_xy(20), batch_size=4, repeat=True, validation_split=0.2)
    assert int(train.cardinality()) == tf.data.INFINITE_CARDINALITY
    assert int(val.cardinality()) == 1
    train, val = tfdata.pipeline(
        _xy(16), batch_size=4, strategy=mirrored, distribute=True, validation_split=0.25
    )
    assert all(isinstance(d, tf.distribute.DistributedDataset) for d in (train, val))
    # the same structure; validation keeps its partial last batch (batch dimension unknown)
    val_x = val.element_spec[0]._value_specs[0]
    train_x = train.element_spec[0]._value_specs[0]
    assert train_x.shape == (2, 4) and val_x.shape.as_list() == [None, 4]


@pytest.fixture(scope="module")
def split_tfds(tmp_path_factory):
    """A TFDS dataset prepared here: 40 train 4x4 images, image i is flat at level i."""
    data_dir = tmp_path_factory.mktemp("tfds_split")
    prepare_tfds(data_dir, "tfgpu_split_digits", side=4, classes=2, splits={"train": range(40)})
    return data_dir


def test_validation_split_with_a_tfds_name_slices_the_split(split_tfds):
    name = "tfgpu_split_digits"
    train, val = tfdata.pipeline(name, data_dir=split_tfds, batch_size=5, validation_split=0.25)
    pixels = lambda ds: [int(v) for x, _ in ds for v in x[:, 0, 0, 0]]  # noqa: E731
    train_ids, val_ids = pixels(train), pixels(val)
    assert len(train_ids) == 30 and len(val_ids) == 10
    assert sorted(train_ids + val_ids) == list(range(40)) and pixels(val) == val_ids
    with pytest.raises(ValueError, match=r"Conflicting arguments: split='train\[:50%\]' and "):
        tfdata.pipeline(
            name, data_dir=split_tfds, split="train[:50%]", batch_size=5, validation_split=0.2
        )


def test_batch_map_fn_runs_on_batches_before_batch_augment_fn_and_on_validation():
    def batch_map(x, y):
        return x * 10.0, y

    def batch_augment(x, y):
        return x + 1.0, y

    train, val = tfdata.pipeline(
        _xy(12),
        batch_size=4,
        shuffle=False,
        batch_map_fn=batch_map,
        batch_augment_fn=batch_augment,
        validation_split=1 / 3,
    )
    x, y = next(iter(train))
    np.testing.assert_allclose(x[:, 0], y.numpy() * 10.0 + 1.0)  # map, then augment
    x, y = next(iter(val))
    np.testing.assert_allclose(x[:, 0], y.numpy() * 10.0)  # map only
    with pytest.raises(TypeError, match=r"`batch_map_fn`.*batch_map_fn\(c0, c1\)"):
        tfdata.pipeline(_xy(8), batch_size=4, batch_map_fn=lambda x: x)
    with pytest.raises(TypeError, match=r"Invalid type for argument `batch_map_fn`"):
        tfdata.pipeline(_xy(8), batch_size=4, batch_map_fn="lowercase")


def test_validation_split_of_a_dataset_reading_files_is_sharded_by_example(
    tmp_path, mirrored, monkeypatch
):
    """A file-reading dataset passed in: AUTO would become FILE, and take/skip would count
    each worker's files; both sides are sharded by example (DATA) instead."""
    _write_tfrecords(tmp_path)  # 4 files of 8 records, ids 0..31
    files = sorted(str(f) for f in tmp_path.glob("part-*.tfrecord"))
    monkeypatch.setattr(_pipeline, "_worker_count", lambda strategy: 2)

    def make():
        source = tf.data.TFRecordDataset(files).map(_parse)
        source = source.apply(tf.data.experimental.assert_cardinality(32))
        return tfdata.pipeline(source, batch_size=2, strategy=mirrored, validation_split=0.25)

    data = tf.data.experimental.AutoShardPolicy.DATA
    assert all(d.options().experimental_distribute.auto_shard_policy == data for d in make())
    trains, vals = [], []
    for worker in range(2):
        train, val = make()
        trains.append(_label_ids(_validation_shard((None, train), 2, worker)))
        vals.append(_label_ids(_validation_shard((None, val), 2, worker)))
        assert trains[-1] and vals[-1] and not set(trains[-1]) & set(vals[-1])
    assert sorted(trains[0] + trains[1]) == list(range(24))
    assert sorted(vals[0] + vals[1]) == list(range(24, 32))


def test_validation_side_of_a_dataset_is_cached_so_its_source_runs_once():
    runs = tf.Variable(0, dtype=tf.int64)

    def load(i):  # the source's own map: counts the examples it really produces
        return tf.cast(i + 0 * runs.assign_add(1), tf.float32), i

    source = tf.data.Dataset.range(50).map(load)
    train, val = tfdata.pipeline(source, batch_size=5, validation_split=0.2)
    assert _label_ids(val) == list(range(40, 50))
    after_first = int(runs.numpy())
    assert after_first == 50  # skip(40) runs the source's map on every training example
    assert _label_ids(val) == list(range(40, 50))
    assert int(runs.numpy()) == after_first  # the second pass reads the cache
    assert sorted(_label_ids(train)) == list(range(40))  # the training side reads the source
    assert int(runs.numpy()) == after_first + 40


def _val_plan(facts=None, **kwargs):
    facts = facts or _facts(kind="dataset", num_examples=None, has_map_fn=False)
    plan = decide(
        facts,
        batch_size=4,
        per_replica_batch_size=None,
        cache=kwargs.get("cache", "auto"),
        shuffle=True,
        shuffle_buffer=None,
        drop_remainder=kwargs.get("drop_remainder"),
        deterministic=None,
        seed=None,
        has_strategy=kwargs.get("has_strategy", True),
        private_threadpool_size=0,
    )
    return validation_plan(
        plan,
        facts,
        cache=kwargs.get("cache", "auto"),
        drop_remainder=kwargs.get("drop_remainder"),
        num_examples=kwargs.get("num_examples", 100),
        element_bytes=kwargs.get("element_bytes", 16),
    )


def test_validation_plan_keeps_partial_batches_and_caches_what_fits():
    plan = _val_plan()
    assert plan.drop_remainder is False and plan.shuffle_buffer is None and plan.deterministic
    assert plan.cache == "memory"
    assert _val_plan(drop_remainder=True).drop_remainder is True  # only when asked for
    assert _val_plan(drop_remainder=False).drop_remainder is False
    assert _val_plan(cache=False).cache is None
    assert _val_plan(element_bytes=2**40).cache is None  # over the RAM budget
    assert _val_plan(element_bytes=None, num_examples=2_000).cache == "memory"  # small by count
    assert _val_plan(element_bytes=None, num_examples=2_001).cache is None
    assert _val_plan(num_examples=None).cache is None  # TFRecord hash split: count unknown
    random = _facts(kind="dataset", num_examples=None, map_fn_random_ops=("RandomUniform",))
    assert _val_plan(random).cache is None
    arrays = _facts(kind="memory", num_examples=100, has_map_fn=False)
    assert _val_plan(arrays).cache is None  # already in memory
    split = _facts(kind="dataset", num_examples=100, workers=2, split_by_position=True)
    assert _plan(split).shard_policy == "DATA" and _plan(split).shuffle_seed is not None
    assert _plan(_facts(kind="dataset", num_examples=100)).shard_policy == "AUTO"


def test_validation_keeps_every_example_under_a_strategy(mirrored):
    """MirroredStrategy drops partial training batches by default; validation keeps them."""
    train, val = tfdata.pipeline(_xy(105), batch_size=4, strategy=mirrored, validation_split=0.2)
    assert len(_label_ids(train)) == 84 and _label_ids(val) == list(range(84, 105))
    _, val = tfdata.pipeline(_xy(105), batch_size=4, strategy=mirrored, validation_split=0.2)
    dist = mirrored.experimental_distribute_dataset(val)
    seen = [v for y in (b[1] for b in dist) for v in _ids(mirrored.experimental_local_results(y))]
    assert sorted(seen) == list(range(84, 105))
    _, val = tfdata.pipeline(
        _xy(105), batch_size=4, strategy=mirrored, validation_split=0.2, drop_remainder=True
    )
    assert _label_ids(val) == list(range(84, 104))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("map_fn", "one example"),
        ("augment_fn", "one example"),
        ("batch_map_fn", "one batch"),
        ("batch_augment_fn", "one batch"),
    ],
)
def test_function_arguments_say_what_they_are_called_on(name, expected):
    with pytest.raises(TypeError, match=rf"`{name}`.*Received: {name}=1.*a function of {expected}"):
        tfdata.pipeline(_xy(8), batch_size=4, **{name: 1})


@pytest.mark.parametrize(
    "name, returned, what",
    [
        ("map_fn", None, "example"),
        ("augment_fn", None, "example"),
        ("batch_map_fn", None, "batch"),
        ("batch_augment_fn", (), "batch"),
        ("map_fn", {}, "example"),
    ],
)
def test_a_function_that_returns_nothing_is_named(name, returned, what):
    def forgot_return(x, y):
        x * 2.0

        return returned

    with pytest.raises(
        TypeError,
        match=rf"argument `{name}`\. Received: {name}=forgot_return, which returned "
        rf"{re.escape(repr(returned))} on the {what} .*Expected a function that returns the "
        rf"new {what}",
    ):
        tfdata.pipeline(_xy(8), batch_size=4, validation_split=0.5, **{name: forgot_return})
