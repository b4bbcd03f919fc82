"""Every reach into Keras's private internals, one function each (None, or nothing done, where this
Keras keeps it elsewhere; `tests/test_keras_internals.py` names what moved); TF imported lazily."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from tfgpu._internal.helpers.checks import is_int

_LOG = logging.getLogger(__name__)

CHECKED_KERAS = (3, 15)  # the Keras version (major, minor) every reach below was checked against

# Marks on the functions tfgpu puts in place of `model.train_function`.
_OWNER = "_tfgpu_backup"
_ORIGINAL = "_tfgpu_original"


def keras_version() -> str:
    """The installed Keras version, e.g. "3.15.1"."""
    import keras

    return str(keras.__version__)


def moved(what: str) -> str:
    """A sentence for when a reach found nothing: what moved, in which Keras version."""
    return (
        f"Keras {keras_version()} keeps {what} elsewhere than Keras "
        f"{CHECKED_KERAS[0]}.{CHECKED_KERAS[1]} (tfgpu/_internal/adapters/keras_internals.py)"
    )


def _fit_frame(model: Any, frame: FrameType | None) -> FrameType | None:
    """The frame of the `fit` call (of `model`, when given) that encloses `frame`."""
    while frame is not None:
        code = frame.f_code
        if (
            code.co_name == "fit"
            and "epoch_iterator" in code.co_varnames
            and (model is None or frame.f_locals.get("self") is model)
        ):
            return frame
        frame = frame.f_back
    return None


def fit_epoch_iterator(model: Any = None) -> Any:
    """The epoch iterator of the running `fit` (of `model` if given), seen from a hook, or None."""
    frame = _fit_frame(model, sys._getframe(1))
    return None if frame is None else frame.f_locals.get("epoch_iterator")


def fit_batch_size(model: Any = None) -> int | None:
    """The batch size of the running `fit` (its adapter's, else its dataset's), or None."""
    iterator = fit_epoch_iterator(model)
    adapter = getattr(iterator, "data_adapter", None)
    try:
        size: Any = adapter.batch_size if adapter is not None else None
    # DataAdapter's own NotImplementedError; TFDatasetAdapter's IndexError (an element with no
    # component, or a scalar one) or AttributeError (a dataset without an element spec)
    except (AttributeError, IndexError, NotImplementedError):  # an adapter that cannot tell
        size = None
    if size is None and iterator is not None:
        from tfgpu._internal.adapters.datasets import source_batches

        try:
            batches, _ = source_batches(source_dataset(iterator))
            size = None if batches is None else batches.batch_size
        except (AttributeError, TypeError, ValueError):  # not a tf.data.Dataset
            size = None
    return int(size) if is_int(size) and size > 0 else None


# Modules whose callbacks only hand Keras's hooks on to another callback (`tfgpu run`'s): their
# frames are not the function driving the callbacks.
FORWARDING_MODULES: set[str] = set()


def training_frame(caller_module: str) -> FrameType | None:
    """The frame of the function driving the callbacks (Keras `fit`, or a custom loop): the
    first outwards that is not `caller_module`'s, this module's, a `FORWARDING_MODULES` one's
    or `keras.src.callbacks`'."""
    frame: FrameType | None = sys._getframe(1)
    skipped = {caller_module, __name__, *FORWARDING_MODULES}
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module not in skipped and not module.startswith("keras.src.callbacks"):
            return frame
        frame = frame.f_back
    return None


class FitWatch:
    """A wish, made by `when_fit_ends`, to be told when a training function left its thread."""

    def __init__(self, thread_id: int, frame: FrameType, callback: Callable[[], None]):
        self.thread_id, self.frame, self.callback = thread_id, frame, callback

    def running(self) -> bool:
        """Whether the watched function is still on its thread's stack."""
        return _on_stack(self.frame, sys._current_frames().get(self.thread_id))

    def cancel(self) -> None:
        with _WATCH_LOCK:
            if self in _WATCHES:
                _WATCHES.remove(self)
        self.frame = None  # type: ignore[assignment]  # drops the caller's locals


# The watches, and the one daemon thread that checks them every `WATCH_INTERVAL_S`.
WATCH_INTERVAL_S = 0.25
_WATCHES: list[FitWatch] = []
_WATCH_LOCK = threading.Lock()
_watcher: threading.Thread | None = None


def when_fit_ends(callback: Callable[[], None], caller_module: str) -> FitWatch | None:
    """Calls `callback()` from a daemon thread once the function driving the hooks has returned
    or raised (Keras skips `on_train_end` when `fit` raises): it must be safe after that."""
    global _watcher
    frame = training_frame(caller_module)
    if frame is None:
        return None
    watch = FitWatch(threading.get_ident(), frame, callback)
    with _WATCH_LOCK:
        _WATCHES.append(watch)
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch_loop, name="tfgpu-fit-watch", daemon=True)
            _watcher.start()
    return watch


def check_fit_watches() -> None:
    """One pass of the watcher: calls the callbacks of the watched frames that are gone."""
    stacks = sys._current_frames()
    with _WATCH_LOCK:
        ended = [w for w in _WATCHES if not _on_stack(w.frame, stacks.get(w.thread_id))]
        for watch in ended:
            _WATCHES.remove(watch)
    del stacks
    for watch in ended:
        callback, watch.frame = watch.callback, None  # type: ignore[assignment]
        try:
            callback()
        except Exception:  # the watcher's boundary: one failed callback never stops the others
            _LOG.exception("tfgpu: a callback for the end of fit failed")


def _on_stack(target: FrameType | None, frame: FrameType | None) -> bool:
    while frame is not None and frame is not target:
        frame = frame.f_back
    return frame is not None


def _watch_loop() -> None:
    global _watcher
    while True:
        time.sleep(WATCH_INTERVAL_S)
        check_fit_watches()
        with _WATCH_LOCK:
            if not _WATCHES:
                _watcher = None
                return


def distributed_dataset(epoch_iterator: Any) -> Any:
    """What each epoch's iterator is made from (`TFEpochIterator._distributed_dataset`)."""
    iterator_class = getattr(_trainer_module(), "TFEpochIterator", None)
    if iterator_class is None or not isinstance(epoch_iterator, iterator_class):
        return None
    return getattr(epoch_iterator, "_distributed_dataset", None)


def set_distributed_dataset(epoch_iterator: Any, dataset: Any) -> None:
    """Puts `dataset` where `fit` makes each epoch's iterator from."""
    epoch_iterator._distributed_dataset = dataset


def source_dataset(epoch_iterator: Any) -> Any:
    """The user's dataset as `fit` received it (the data adapter's `_dataset`), or None."""
    return getattr(getattr(epoch_iterator, "data_adapter", None), "_dataset", None)


def current_iterator(epoch_iterator: Any) -> Any:
    """The input iterator the epoch iterator holds (kept across epochs with `steps_per_epoch`)."""
    return getattr(epoch_iterator, "_current_iterator", None)


def steps_per_epoch(epoch_iterator: Any) -> int | None:
    """The `steps_per_epoch` the epoch iterator was made with, or None."""
    return getattr(epoch_iterator, "steps_per_epoch", None)


def array_batches(x: Any, y: Any, sample_weight: Any, batch_size: int) -> Any:
    """The batches `fit(x, y, batch_size=..., shuffle=True)` trains on: Keras's own array
    adapter's `tf.data.Dataset` (reshuffled every epoch, one vectorized gather per batch), or
    None where this Keras keeps it elsewhere."""
    try:
        from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    except ImportError:
        return None
    try:
        adapter = ArrayDataAdapter(
            x, y=y, sample_weight=sample_weight, batch_size=batch_size, shuffle=True
        )
        return adapter.get_tf_dataset()
    except (TypeError, AttributeError):  # another signature
        return None


def train_function(model: Any) -> Callable | None:
    """The function `fit` calls for each execution (`model.train_function`), or None."""
    return getattr(model, "train_function", None)


def keras_train_function(function: Any) -> Any:
    """Keras's own train function under any tfgpu wrappers left on it."""
    while getattr(function, _ORIGINAL, None) is not None:
        function = getattr(function, _ORIGINAL)
    return function


def wrapper_owner(function: Any) -> Any:
    """The object that installed `function` with `install_train_function`, or None."""
    return getattr(function, _OWNER, None)


def install_train_function(model: Any, wrapper: Callable, owner: Any, original: Any) -> None:
    """Makes `fit` call `wrapper`, marked with its `owner` and `original` (Keras's function)."""
    setattr(wrapper, _OWNER, owner)
    setattr(wrapper, _ORIGINAL, original)
    model.train_function = wrapper


def restore_train_function(model: Any, owner: Any, original: Any) -> None:
    """Puts `original` back, if the function on the model is still `owner`'s wrapper."""
    if wrapper_owner(getattr(model, "train_function", None)) is owner:
        model.train_function = original


def set_initial_epoch(model: Any, epoch: int) -> None:
    """Makes the running `fit` start at `epoch` (read after `on_train_begin`), marked as tfgpu's."""
    model._initial_epoch = epoch
    model._tfgpu_initial_epoch = epoch


def clear_initial_epoch(model: Any) -> None:
    """Undoes a `set_initial_epoch` a raising `fit` left (every later `fit` would skip them too)."""
    ours = getattr(model, "_tfgpu_initial_epoch", None)
    if ours is not None:
        if getattr(model, "_initial_epoch", None) == ours:
            model._initial_epoch = None
        model._tfgpu_initial_epoch = None


def global_seed_generator(create: bool = False) -> Any:
    """Keras's global `SeedGenerator` (for layers with no seed) or None; `create=True` makes it."""
    if create:
        from keras.src.random.seed_generator import global_seed_generator as make

        return make()
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


# Keras 3 with TensorFlow 2.21 fails in a real multi-worker `fit` (docs/distributed.md, "The Keras 3
# correction"): delete this section once `tests/test_multi_worker.py` says upstream works.

_correction_lock = threading.Lock()
_correction_installed = False


def _trainer_module() -> Any:
    """Keras's TensorFlow trainer module, or None where this Keras has none."""
    try:
        from keras.src.backend.tensorflow import trainer
    except ImportError:
        return None
    return trainer


def needs_multi_worker_correction(strategy: Any) -> bool:
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` in multi-worker mode (see above)."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    return bool(strategy.extended._in_multi_worker_mode())


def _local_value(value: Any) -> Any:
    """The first local replica's component of a distributed value; other values unchanged."""
    import tensorflow as tf

    return value.values[0] if isinstance(value, tf.distribute.DistributedValues) else value


def install_multi_worker_correction() -> bool:
    """Installs the multi-worker `fit` correction into Keras's TensorFlow trainer (idempotent);
    False, with a logged warning, where this Keras lacks the functions it corrects."""
    global _correction_installed
    with _correction_lock:
        if _correction_installed:
            return True
        installed = tuple(int(p) for p in keras_version().split(".")[:2])
        version = ".".join(map(str, installed))
        if installed[0] != 3:
            _LOG.warning(
                "tfgpu: Keras %s is not Keras 3; the multi-worker fit correction is not applied.",
                version,
            )
            return False
        from keras import tree

        tf_trainer = _trainer_module()
        original_reduce = getattr(tf_trainer, "reduce_per_replica", None)
        original_build = getattr(
            getattr(tf_trainer, "TensorFlowTrainer", None), "_maybe_symbolic_build", None
        )
        if original_reduce is None or original_build is None:
            _LOG.warning(
                "tfgpu: this Keras has no trainer.reduce_per_replica/_maybe_symbolic_build; "
                "the multi-worker fit correction is not applied (upstream may have fixed it)."
            )
            return False
        if installed > CHECKED_KERAS:
            _LOG.info(
                "tfgpu: Keras %s is newer than the last version checked (3.%d); applying the "
                "multi-worker fit correction anyway. Re-run the upstream check in "
                "tests/test_multi_worker.py to see whether it is still needed.",
                version,
                CHECKED_KERAS[1],
            )

        def reduce_per_replica(values, strategy, reduction):
            if reduction not in ("auto", "mean") or not needs_multi_worker_correction(strategy):
                return original_reduce(values, strategy, reduction)

            def reduce_one(v):
                if _local_value(v).shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original_reduce(v, strategy, reduction)

            return tree.map_structure(reduce_one, values)

        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            strategy = self._distribute_strategy
            if strategy is None or iterator is None or not needs_multi_worker_correction(strategy):
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
        _correction_installed = True
        _LOG.info(
            "tfgpu: installed the Keras multi-worker fit correction (tfgpu/_internal/adapters/keras_internals.py)."
        )
        return True


def _has_parameters(function: Any, *names: str) -> bool:
    """Whether `function` (unwrapped) is callable with parameters `names`."""
    if not callable(function):
        return False
    try:
        parameters = inspect.signature(inspect.unwrap(function)).parameters
    except (TypeError, ValueError):
        return False
    return all(n in parameters for n in names)


def problems_in_trainer() -> list[str]:
    """What the multi-worker `fit` correction reaches for that this Keras or TensorFlow lacks."""
    tf_trainer = _trainer_module()
    if tf_trainer is None:
        return [moved("the TensorFlow trainer (`keras.src.backend.tensorflow.trainer`)")]
    trainer_class = getattr(tf_trainer, "TensorFlowTrainer", None)
    reaches = [
        ("trainer", tf_trainer, "reduce_per_replica", ("values", "strategy", "reduction")),
        ("TensorFlowTrainer", trainer_class, "_maybe_symbolic_build", ("iterator", "data_batch")),
        ("TensorFlowTrainer", trainer_class, "_symbolic_build", ("data_batch",)),
    ]
    found = [
        moved(f"`{owner}.{name}({', '.join(parameters)})`")
        for owner, holder, name, parameters in reaches
        if not _has_parameters(getattr(holder, name, None), *parameters)
    ]
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

    extended = getattr(mwms, "CollectiveAllReduceExtended", None)
    if not callable(getattr(extended, "_in_multi_worker_mode", None)):
        found.append(
            f"TensorFlow {tf.__version__} has no `MultiWorkerMirroredStrategy.extended."
            "_in_multi_worker_mode()` (tfgpu/_internal/adapters/keras_internals.py)"
        )
    return found


def problems_in_fit(model: Any) -> list[str]:
    """What this Keras no longer has where tfgpu reaches for it ([]: every reach finds its
    target); call it from a hook of `fit`, as `tests/test_keras_internals.py` does."""
    frame = _fit_frame(model, sys._getframe(1))
    if frame is None:
        return [moved("`fit`'s frame with a local `epoch_iterator`")]
    iterator = frame.f_locals.get("epoch_iterator")
    checks = [
        ("the epoch iterator's `data_adapter`", hasattr(iterator, "data_adapter")),
        ("`TFEpochIterator._distributed_dataset`", distributed_dataset(iterator) is not None),
        ("`EpochIterator._current_iterator`", hasattr(iterator, "_current_iterator")),
        ("`EpochIterator.steps_per_epoch`", hasattr(iterator, "steps_per_epoch")),
        ("`model.train_function`", callable(train_function(model))),
        ("`model._initial_epoch`", hasattr(model, "_initial_epoch")),
        ("the frame of `fit`, driving the hooks", training_frame(__name__) is not None),
    ]
    found = [moved(what) for what, ok in checks if not ok]
    try:
        global_seed_generator()
        global_seed_generator(create=True)
    except (ImportError, AttributeError) as e:
        found.append(moved(f"the global seed generator ({type(e).__name__}: {e})"))
    found.extend(problems_in_trainer())
    return found
