"""A data-parallel step's parts timed apart (`scaling`, `diagnose`): the replicas' compute, the
all-reduce and the optimizer's apply, each a `tf.function` of `STEPS` steps per timed call."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.measure import timing

STEPS = 5  # steps per timed call
CALLS = 5  # timed calls, after one untimed call that traces


def gradient_bytes(model: keras.Model) -> int:
    """Bytes of one step's gradients: the trainable variables' sizes in their dtypes."""
    return int(sum(np.prod(v.shape) * tf.as_dtype(v.dtype).size for v in model.trainable_variables))


def _timed(strategy: tf.distribute.Strategy, step: Any, args: Any = ()) -> float:
    """Seconds per step of `strategy.run(step, (i, *args))`, `STEPS` steps per call."""

    @tf.function
    def run(k: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for i in tf.range(k):
            out = strategy.run(step, args=(i, *args))
            total += tf.add_n(
                [tf.cast(t, tf.float32) for t in strategy.experimental_local_results(out)]
            )
        return total

    steps = tf.constant(STEPS)
    return timing.call_time(lambda: run(steps).numpy(), CALLS) / STEPS


def _first(t: Any) -> tf.Tensor:
    """One element of `t` as float32: enough to make its producer run, without the memory
    traffic of reading all of it (which would add to what is timed)."""
    return tf.cast(tf.reshape(t, [-1])[0], tf.float32)


def compute_s(strategy: tf.distribute.Strategy, model: keras.Model, batch: Any) -> float:
    """Seconds per step of every replica's forward and backward pass, nothing reduced or updated."""
    per = int(tf.nest.flatten(batch)[0].shape[0]) // strategy.num_replicas_in_sync

    def value(ctx: tf.distribute.ValueContext) -> Any:  # this replica's slice of `batch`
        i = ctx.replica_id_in_sync_group
        return tf.nest.map_structure(lambda t: t[i * per : (i + 1) * per], batch)

    @tf.autograph.experimental.do_not_convert  # no Python control flow to convert
    def step(i: tf.Tensor, element: Any) -> tf.Tensor:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(element)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([_first(g) for g in grads if g is not None])

    return _timed(strategy, step, (strategy.experimental_distribute_values_from_function(value),))


def all_reduce_s(strategy: tf.distribute.Strategy, model: keras.Model, *, tiny: bool) -> float:
    """Seconds per step of the optimizer's all-reduce (the replica context's) of each replica's
    trainable variables, read in place; `tiny`: one element per tensor (the latency)."""
    variables = model.trainable_variables

    @tf.autograph.experimental.do_not_convert
    def step(i: tf.Tensor) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        values = [tf.convert_to_tensor(v.value) for v in variables]
        if tiny:
            values = [tf.reshape(t, [-1])[:1] for t in values]
        out = ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)
        return tf.add_n([_first(t) for t in out])

    return _timed(strategy, step)


def apply_s(strategy: tf.distribute.Strategy, model: keras.Model) -> float:
    """Seconds per step of `apply_gradients` on every replica as in `fit` (all-reduce and update),
    the variables as gradients: it changes the model, so call it on one built for measuring."""
    variables = model.trainable_variables
    optimizer = model.optimizer

    @tf.autograph.experimental.do_not_convert
    def step(i: tf.Tensor) -> tf.Tensor:
        grads = [tf.convert_to_tensor(v.value) for v in variables]
        optimizer.apply_gradients(zip(grads, variables))
        return _first(variables[0].value)

    return _timed(strategy, step)
