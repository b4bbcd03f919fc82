"""TensorFlow Datasets: `load_tfds()`, failing in seconds offline instead of retrying."""

from __future__ import annotations

import difflib
import os
import re
from typing import Any

import tensorflow as tf

from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_int,
    invalid_type,
    invalid_value,
)
from tfgpu._internal.helpers.lazy import import_optional
from tfgpu.data._limits import MAX_SEED, SEED


def check_tfds_name(name: str, data_dir: str | os.PathLike | None, arg: str = "name") -> None:
    """Raises `ValueError` for a name that no registered builder and nothing on disk knows."""
    tfds = import_optional("tensorflow_datasets")
    base = name.split(":")[0].split("/")[0]
    known = tfds.list_builders(with_community_datasets=False)
    if base in known:
        return
    root = _data_root(data_dir)
    if os.path.isdir(os.path.join(root, base)):  # prepared elsewhere, copied here
        return
    close = difflib.get_close_matches(base, known, n=3)
    hint = f" (Did you mean: {', '.join(repr(c) for c in close)}?)" if close else ""
    raise invalid_value(
        arg,
        name,
        "one of `tfds.list_builders()` or a file pattern that matches files",
        received=f"{arg}={name!r}, which is neither a TensorFlow Datasets builder nor a dataset "
        f"prepared in {root}{hint}",
    )


def _data_root(data_dir: str | os.PathLike | None) -> str:
    """`data_dir`, else TFDS's default."""
    if data_dir is not None:
        return os.fspath(data_dir)
    tfds = import_optional("tensorflow_datasets")
    try:
        return os.fspath(tfds.core.constants.data_dir())
    except AttributeError:  # older/newer layouts
        return os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))


_SPLIT_NAME = re.compile(r"\s*([\w\-]+)")  # "train" of "train[:90%]"


def tfds_split_info(info: Any, split: str) -> Any:
    base = _SPLIT_NAME.match(split)
    try:
        return info.splits[base.group(1)] if base else None
    except (AttributeError, KeyError, TypeError, ValueError):  # no such split, or no splits
        return None


def load_tfds(
    name: str,
    split: str = "train",
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    shuffle_files: bool = True,
    as_supervised: bool | None = None,
    seed: int | None = None,
    with_info: bool = False,
) -> tf.data.Dataset | tuple[tf.data.Dataset, Any]:
    """Loads a TensorFlow Datasets dataset for training, with fast reading options.

    Reads and decodes in parallel, shuffles the file order every epoch, returns `(input,
    label)` pairs where defined, and fails at once for a dataset not prepared in `data_dir`
    (saying how to get it). The guide: docs/data.md, "load_tfds".

    Args:
        name: str, the TFDS name, with an optional config and version (`"cifar10:3.0.2"`).
        split: str, the split or split expression (`"train[:90%]"`). Defaults to `"train"`.
        data_dir: path, where prepared datasets live. Defaults to None: TFDS's default.
        download: bool, download and prepare a dataset not in `data_dir`. Defaults to False.
        shuffle_files: bool, shuffle the files' order every epoch. Defaults to True.
        as_supervised: bool, `(input, label)` tuples instead of feature dicts. Defaults to
            None: True when the dataset defines supervised keys.
        seed: int, seed for the file shuffle. Defaults to None.
        with_info: bool, also return the `tfds.core.DatasetInfo`. Defaults to False.

    Returns:
        A `tf.data.Dataset` of unbatched examples, or `(dataset, info)` with `with_info=True`.

    Raises:
        TypeError: for a `name`, `split`, flag or `seed` of the wrong type.
        ValueError: for an unknown name (with close matches) or split, a bad seed or data_dir.
        FileNotFoundError: for a dataset not prepared in `data_dir`, with `download=False`.
        ImportError: when `tensorflow-datasets` is not installed (with the pip line).

    Example:

    ```python
    train = tfgpu.data.load_tfds("mnist", "train", data_dir="/data/tfds")
    train = tfgpu.data.pipeline(train, batch_size=256, map_fn=normalize)
    ```
    """
    check_bool("with_info", with_info)
    options = dict(locals())  # every argument, by name, as `load_tfds_dataset` takes them
    del options["with_info"]
    ds, info = load_tfds_dataset(**options, prefetch=True)
    return (ds, info) if with_info else ds


def load_tfds_dataset(
    name: Any,
    split: Any,
    *,
    data_dir: Any,
    download: bool,
    shuffle_files: bool,
    as_supervised: bool | None,
    seed: int | None,
    prefetch: bool,
) -> tuple[tf.data.Dataset, Any]:
    for arg, value, example in (
        ("name", name, "a non-empty str such as 'mnist'"),
        ("split", split, "a str such as 'train' or 'train[:90%]'"),
    ):
        if not isinstance(value, str):
            raise invalid_type(arg, value, example)
        if not value.strip():
            raise invalid_value(arg, value, example)
    for arg, flag in (("download", download), ("shuffle_files", shuffle_files)):
        check_bool(arg, flag)
    check_bool("as_supervised", as_supervised, allow_none=True)
    seed = check_int("seed", seed, minimum=0, maximum=MAX_SEED, allow_none=True, expected=SEED)
    data_dir = check_dir("data_dir", data_dir, allow_none=True)
    tfds = import_optional("tensorflow_datasets")
    check_tfds_name(name, data_dir)
    kwargs = {"data_dir": os.fspath(data_dir)} if data_dir is not None else {}
    try:
        builder = tfds.builder(name, **kwargs)
    # ValueError: TFDS's DatasetNotFoundError, an unknown config or version; TypeError: bad
    # builder arguments in the name; the others: a builder that cannot import its code or
    # read its files (a damaged dataset_info.json: KeyError).
    except (ValueError, TypeError, KeyError, ImportError, OSError, tf.errors.OpError) as e:
        raise invalid_value(
            "name",
            name,
            "a name TensorFlow Datasets can build: a builder with one of its configs and "
            "versions, e.g. 'mnist' or 'mnist:3.*.*'",
            received=f"name={name!r}, which TensorFlow Datasets cannot build "
            f"({type(e).__name__}: {str(e).strip()})",
        ) from e
    root = _data_root(data_dir)
    if not builder.is_prepared():
        if not download:
            # First the command that works with what tfgpu installs (`tfds build` needs beam).
            raise FileNotFoundError(
                f"TensorFlow Datasets dataset {name!r} is not prepared in {root} (looked for "
                f"{builder.data_dir}). To get it: on a machine with internet run "
                f'`python -c "import tfgpu; tfgpu.data.load_tfds({name!r}, download=True, '
                f'data_dir={root!r})"`, then copy that data_dir to this machine and pass it as '
                f"`data_dir` (TFDS's own `tfds build {name.split(':')[0]} --data_dir {root}` "
                "needs `pip install apache-beam` first)."
            )
        builder.download_and_prepare()
    info = builder.info
    known = set(info.splits.keys())
    for part in split.split("+"):
        base = _SPLIT_NAME.match(part)
        if base is None or base.group(1) not in known:
            raise invalid_value(
                "split",
                split,
                f"a split of {name!r}: one of {sorted(known)} (slicing such as 'train[:10%]' "
                "is allowed)",
            )
    if as_supervised is None:
        as_supervised = bool(info.supervised_keys)
    read_config = tfds.ReadConfig(
        shuffle_seed=seed,
        shuffle_reshuffle_each_iteration=True,
        interleave_cycle_length=tf.data.AUTOTUNE,
        num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
        num_parallel_calls_for_decode=tf.data.AUTOTUNE,
        skip_prefetch=not prefetch,
    )
    ds = builder.as_dataset(
        split=split,
        shuffle_files=shuffle_files,
        as_supervised=as_supervised,
        read_config=read_config,
    )
    return ds, info
