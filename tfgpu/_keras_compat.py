"""A narrow correction that lets Keras 3 `model.fit` run under `MultiWorkerMirroredStrategy`.

Keras 3 (checked up to 3.15) with TensorFlow 2.21 fails in `model.fit` as soon as a
`MultiWorkerMirroredStrategy` really spans several workers, in two places of
`keras/src/backend/tensorflow/trainer.py`:

1. `TensorFlowTrainer._maybe_symbolic_build` reduces the first (per-replica) data batch with
   `strategy.reduce("MEAN", batch, axis=None)` to get something to build the model from. Under
   multi-worker that becomes a collective on a `PerReplica` value and fails with
   `ValueError: Attempt to convert a value (PerReplica:{...}) ... to a Tensor`. The build only
   needs shapes and dtypes, so the correction builds from this worker's first local replica
   value, with no communication at all.
2. `reduce_per_replica(..., reduction="auto")` reduces every log with
   `strategy.reduce("MEAN", v, axis=0)` in multi-worker mode; logs are scalars, so TensorFlow
   raises `ValueError: Invalid reduction dimension 0 for input with 0 dimensions`
   (tensorflow/tensorflow#72388, closed without a fix). The correction reduces rank-0 values
   with `axis=None` (a mean across replicas) and leaves everything else to Keras.

Both corrections wrap the Keras functions and change nothing unless the model's strategy is a
`MultiWorkerMirroredStrategy` in multi-worker mode. `tfgpu.strategy()` installs them only
when it returns such a strategy, and only for Keras versions in `_PATCHED_KERAS` whose
trainer still has the two functions. `tests/test_multi_worker.py` runs plain Keras without
the correction and fails loudly once upstream no longer breaks, which is the signal to
delete this module.
"""

from __future__ import annotations

import logging
import threading

_LOG = logging.getLogger("tfgpu")

# Keras versions (major, minor) known to need the correction: 3.0 up to 3.15 inclusive.
# A newer Keras is corrected too while it still has the functions, with a log line asking
# to re-run the upstream check (tests/test_multi_worker.py::test_upstream_keras_still_needs_it).
_PATCHED_KERAS = ((3, 0), (3, 15))

_lock = threading.Lock()
_installed = False


def _keras_version() -> tuple[int, int]:
    import keras

    major, minor = (int(p) for p in keras.__version__.split(".")[:2])
    return major, minor


def needs_correction(strategy) -> bool:
    """Returns True if `strategy` is a multi-worker `MultiWorkerMirroredStrategy`.

    Args:
        strategy: tf.distribute.Strategy, the strategy a model is trained under.

    Returns:
        True when Keras's TensorFlow trainer would hit the multi-worker bugs above.
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    return bool(strategy.extended._in_multi_worker_mode())


def _local_value(value):
    """The first local replica's component of a distributed value; other values unchanged."""
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def install() -> bool:
    """Installs the correction into Keras's TensorFlow trainer (idempotent).

    Returns:
        True if the correction is installed (now or before), False if this Keras does not
        have the functions it corrects (then nothing is changed and a warning is logged).
    """
    global _installed
    with _lock:
        if _installed:
            return True
        if _keras_version()[0] != 3:
            _LOG.warning(
                "tfgpu: Keras %s is not Keras 3; the multi-worker fit correction is not applied.",
                ".".join(map(str, _keras_version())),
            )
            return False
        from keras import tree
        from keras.src.backend.tensorflow import trainer as tf_trainer

        original_reduce = getattr(tf_trainer, "reduce_per_replica", None)
        original_build = getattr(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", None)
        if original_reduce is None or original_build is None:
            _LOG.warning(
                "tfgpu: this Keras has no trainer.reduce_per_replica/_maybe_symbolic_build; "
                "the multi-worker fit correction is not applied (upstream may have fixed it)."
            )
            return False
        if _keras_version() > _PATCHED_KERAS[1]:
            _LOG.info(
                "tfgpu: Keras %s is newer than the last version checked (3.%d); applying the "
                "multi-worker fit correction anyway. Re-run the upstream check in "
                "tests/test_multi_worker.py to see whether it is still needed.",
                ".".join(map(str, _keras_version())),
                _PATCHED_KERAS[1][1],
            )

        def reduce_per_replica(values, strategy, reduction):
            if reduction not in ("auto", "mean") or not needs_correction(strategy):
                return original_reduce(values, strategy, reduction)

            def reduce_one(v):
                if _local_value(v).shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original_reduce(v, strategy, reduction)

            return tree.map_structure(reduce_one, values)

        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            strategy = self._distribute_strategy
            if strategy is None or iterator is None or not needs_correction(strategy):
                return original_build(self, iterator=iterator, data_batch=data_batch)
            for _, _, it in iterator:
                data_batch = tree.map_structure(_local_value, next(it))
                break
            with strategy.scope():
                self._symbolic_build(data_batch=data_batch)

        # functools convention: each patch points at the Keras function it replaces.
        reduce_per_replica.__wrapped__ = original_reduce  # type: ignore[attr-defined]
        _maybe_symbolic_build.__wrapped__ = original_build  # type: ignore[attr-defined]
        tf_trainer.reduce_per_replica = reduce_per_replica
        tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
        _installed = True
        _LOG.info(
            "tfgpu: installed the Keras multi-worker fit correction (tfgpu/_keras_compat.py)."
        )
        return True
