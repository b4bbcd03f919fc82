"""Offline stand-ins for the keras.io examples' downloads, for `tests/test_keras_examples.py`
only (this directory goes first on the PYTHONPATH of the processes that test starts; nothing
here is imported by tfgpu).

The examples run unchanged; what they fetch is replaced, never what they compute:

- `keras.utils.get_file` finds the test's small files in `KERAS_HOME` (MNIST, the IMDB archive,
  the Xception weights) and accepts them without their published hash (a download is refused:
  the tests have no network);
- `tf.io.gfile.glob("gs://...")` lists the same names under `TFGPU_OFFLINE_GCS`;
- `pydot` is a stand-in (this directory's `pydot.py`): `keras.utils.plot_model` needs pydot and
  Graphviz, which the test machines lack.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys


def _file_utils(module):
    cache = os.path.realpath(os.environ["KERAS_HOME"]) + os.sep
    validate = module.validate_file

    def validate_file(fpath, file_hash, algorithm="auto", chunk_size=65535):
        if os.path.realpath(fpath).startswith(cache):
            return True  # the test's stand-in file, small: its hash is not the published one
        return validate(fpath, file_hash, algorithm, chunk_size)

    def urlretrieve(url, *args, **kwargs):
        raise OSError(f"offline test: no download of {url} (put a stand-in in KERAS_HOME)")

    module.validate_file = validate_file
    module.urlretrieve = urlretrieve


def _tensorflow(module):
    root = os.environ.get("TFGPU_OFFLINE_GCS")
    if not root:
        return
    glob = module.io.gfile.glob

    def offline_glob(pattern):
        if isinstance(pattern, str) and pattern.startswith("gs://"):
            return sorted(glob(os.path.join(root, pattern[len("gs://") :])))
        return glob(pattern)

    module.io.gfile.glob = offline_glob


_AFTER_IMPORT = {"keras.src.utils.file_utils": _file_utils, "tensorflow": _tensorflow}


class _Patcher(importlib.abc.MetaPathFinder):
    """Runs a stand-in's patch right after the module it patches is imported."""

    def find_spec(self, name, path, target=None):
        if name not in _AFTER_IMPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _AFTER_IMPORT[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patcher())
