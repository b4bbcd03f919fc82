"""tfgpu.data.pipeline on what Keras users already have: the Keras loaders, text, validation.

Built like the public Keras examples: a folder of JPEGs read with
`keras.utils.image_dataset_from_directory`, an `aclImdb`-like folder of texts read with
`keras.utils.text_dataset_from_directory` and vectorized with `TextVectorization`, and every
element structure Keras `fit` accepts. The data is written into `tmp_path` by the tests.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu import data as tfdata
from tfgpu._internal.adapters.datasets import dataset_inputs, made_by_pipeline

NUM_IMAGES = 24  # 12 per class
SIZE = 32
SEQUENCE = 12


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    """Two class folders of 32x32 JPEGs; image i is flat gray at level 10*i (its id)."""
    root = tmp_path_factory.mktemp("images")
    for i in range(NUM_IMAGES):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        image = tf.fill((SIZE, SIZE, 3), tf.constant(10 * i, tf.uint8))
        (folder / f"{i:02d}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
    return root


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """`aclImdb`-like `train/pos` and `train/neg`, 10 reviews each, review i says 'review i'."""
    root = tmp_path_factory.mktemp("aclImdb")
    for i in range(20):
        folder = root / "train" / ("pos" if i % 2 else "neg")
        folder.mkdir(parents=True, exist_ok=True)
        mood = "great fun" if i % 2 else "dull and slow"
        (folder / f"{i}_7.txt").write_text(f"review {i} a {mood} movie <br />")
    return root / "train"


def _images(directory, **kw):
    return keras.utils.image_dataset_from_directory(
        directory, image_size=(SIZE, SIZE), verbose=False, **kw
    )


def _image_ids(ds) -> list[int]:
    """The ids of the images in a dataset of batches (flat gray level / 10)."""
    return [round(float(v) / 10) for x, _ in ds for v in tf.reduce_mean(x, axis=[1, 2, 3])]


def _image_model():
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(2, 3, strides=4),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def test_loader_batches_are_kept_or_rebatched_with_a_known_count(image_dir):
    batched = _images(image_dir)  # batch_size=32 by default: one batch of 24
    kept = tfdata.pipeline(batched)
    assert int(kept.cardinality()) == 1
    assert next(iter(kept))[0].shape == (NUM_IMAGES, SIZE, SIZE, 3)
    rebatched = tfdata.pipeline(batched, batch_size=8)
    assert int(rebatched.cardinality()) == 3
    assert [x.shape for x, _ in rebatched] == [(8, SIZE, SIZE, 3)] * 3
    examples = _images(image_dir, batch_size=None)
    train = tfdata.pipeline(examples, batch_size=8)
    assert int(train.cardinality()) == 3
    assert sorted(_image_ids(train)) == list(range(NUM_IMAGES))
    assert made_by_pipeline(kept) and made_by_pipeline(train)


@pytest.mark.slow
@pytest.mark.parametrize("loader_batch", [None, 32])
def test_image_folder_validation_split_and_fit(image_dir, loader_batch):
    source = _images(image_dir, batch_size=loader_batch, shuffle=False)
    train, val = tfdata.pipeline(source, batch_size=6, validation_split=0.25, seed=1)
    assert int(train.cardinality()) > 0 and int(val.cardinality()) > 0
    assert int(train.cardinality()) == 3 and int(val.cardinality()) == 1
    train_ids, val_ids = _image_ids(train), _image_ids(val)
    assert len(train_ids) == 18 and len(val_ids) == 6
    assert sorted(train_ids + val_ids) == list(range(NUM_IMAGES))  # none lost, none twice
    in_order = _image_ids(source if loader_batch else source.batch(NUM_IMAGES))
    expected_val = in_order[18:]  # the last quarter, in the loader's order
    assert val_ids == expected_val == _image_ids(val)  # the same order every pass
    assert sorted(_image_ids(train)) == sorted(train_ids)  # reshuffled, same examples
    history = _image_model().fit(train, validation_data=val, epochs=1, verbose=0)
    assert {"loss", "val_loss"} <= set(history.history)


def _shuffles(ds) -> int:
    """The shuffle steps in `ds`'s chain (every input of a zip too)."""
    own = "shuffle" in type(ds).__name__.lower()
    return own + sum(_shuffles(d) for d in dataset_inputs(ds) or [])


def test_a_loader_that_reshuffles_gets_no_shuffle_buffer_on_top(image_dir):
    """A loader reshuffles its file paths every epoch; a buffer of decoded images on top only
    delays every epoch's first batch (issue 27). Cached, its one order is reshuffled."""
    examples = _images(image_dir, batch_size=None)
    assert _shuffles(examples) == 1
    assert _shuffles(tfdata.pipeline(examples, batch_size=8)) == 1
    assert _shuffles(tfdata.pipeline(examples, batch_size=8, cache=True)) == 2
    unshuffled = _images(image_dir, batch_size=None, shuffle=False)
    assert _shuffles(unshuffled) == 0 and _shuffles(tfdata.pipeline(unshuffled, batch_size=8)) == 1


def test_a_loader_that_reshuffles_every_epoch_is_refused_with_the_loader_s_way(image_dir):
    shuffled = _images(image_dir, batch_size=None)  # shuffle=True by default
    with pytest.raises(ValueError, match=r"reshuffles.*subset=\"both\", seed=1337.*shuffle=False"):
        tfdata.pipeline(shuffled, batch_size=8, validation_split=0.25)
    # The loader's own split, then a pipeline for each, works.
    train_raw, val_raw = _images(
        image_dir, batch_size=None, validation_split=0.25, subset="both", seed=1337
    )
    train = tfdata.pipeline(train_raw, batch_size=6)
    val = tfdata.pipeline(val_raw, batch_size=6, shuffle=False)
    assert sorted(_image_ids(train) + _image_ids(val)) == list(range(NUM_IMAGES))


def _texts(directory, **kw):
    return keras.utils.text_dataset_from_directory(directory, verbose=False, **kw)


def _vectorizer(raw, output_sequence_length=SEQUENCE):
    layer = keras.layers.TextVectorization(
        max_tokens=100, output_mode="int", output_sequence_length=output_sequence_length
    )
    layer.adapt(raw.map(lambda x, y: x))
    return layer


def _text_model():
    model = keras.Sequential(
        [
            keras.Input((SEQUENCE,), dtype="int64"),
            keras.layers.Embedding(100, 4),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))
    return model


@pytest.mark.slow
def test_text_classifier_with_batch_map_fn(text_dir):
    raw = _texts(text_dir)  # batches of 32 strings, as in the Keras example
    vectorize_layer = _vectorizer(raw)

    def vectorize_text(text, label):  # the Keras example's function, written for batches
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    train = tfdata.pipeline(raw, batch_map_fn=vectorize_text)
    x, y = next(iter(train))
    assert x.shape == (20, SEQUENCE) and x.dtype == tf.int64 and y.shape == (20,)

    # In a fixed order (class by class: the split's mechanics, not a recipe; see the next test).
    examples = _texts(text_dir, batch_size=None, shuffle=False)
    train, val = tfdata.pipeline(
        examples, batch_size=4, validation_split=0.2, batch_map_fn=vectorize_text
    )
    assert int(train.cardinality()) == 4 and int(val.cardinality()) == 1
    assert [x.shape for x, _ in val] == [(4, SEQUENCE)]
    texts = [t.decode() for t, _ in examples.as_numpy_iterator()]
    ids = {tuple(vectorize_layer(tf.constant([t]))[0].numpy()): t for t in texts}
    seen_train = [ids[tuple(row)] for x, _ in train for row in x.numpy()]
    seen_val = [ids[tuple(row)] for x, _ in val for row in x.numpy()]
    assert seen_val == texts[16:] and sorted(seen_train) == sorted(texts[:16])
    history = _text_model().fit(train, validation_data=val, epochs=1, verbose=0)
    assert {"loss", "val_loss"} <= set(history.history)


@pytest.mark.parametrize("length", [SEQUENCE, None])
def test_a_batch_function_passed_as_map_fn_is_refused(text_dir, length):
    examples = _texts(text_dir, batch_size=None, shuffle=False)
    vectorize_layer = _vectorizer(examples.batch(8), output_sequence_length=length)

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    shown = r"\(None, 12\)" if length else r"\(None, None\)"
    with pytest.raises(ValueError, match=rf"`map_fn`.*vectorize_text.*\(\) into shape {shown}"):
        tfdata.pipeline(examples, batch_size=4, map_fn=vectorize_text)
    with pytest.raises(ValueError, match=r"batch_map_fn="):
        tfdata.pipeline(_texts(text_dir), map_fn=vectorize_text)


def test_a_leading_dimension_of_one_is_refused_unless_it_is_one_example_s_own():
    source = (np.array([b"ab", b"c"]), np.array([0, 1]))

    def lengths(s, y):  # written for batches: (batch,) strings -> (batch, 1, 1)
        return tf.expand_dims(tf.strings.length(tf.expand_dims(s, -1)), -1), y

    with pytest.raises(ValueError, match=r"`map_fn`.*lengths.*shape \(1, 1\).*batch_map_fn"):
        tfdata.pipeline(source, batch_size=2, map_fn=lengths)

    def channels_first(s, y):  # one example: a (1, 2, 1) channels-first image
        return tf.reshape(tf.cast(tf.io.decode_raw(s, tf.uint8)[:2], tf.float32), (1, 2, 1)), y

    ds = tfdata.pipeline(
        (np.array([b"ab", b"cd"]), np.array([0, 1])), batch_size=2, map_fn=channels_first
    )
    assert next(iter(ds))[0].shape == (2, 1, 2, 1)


def _jpegs(n=6):
    images = [
        tf.io.encode_jpeg(tf.fill((SIZE - i, SIZE, 3), tf.constant(i, tf.uint8))) for i in range(n)
    ]
    return tf.stack(images), np.arange(n)


def test_examples_of_unknown_size_warn_once_with_the_fixes():
    def decode(jpeg, label):
        return tf.io.decode_jpeg(jpeg, channels=3), label

    with pytest.warns(
        UserWarning, match=r"`map_fn` \(decode\).*element\[0\] \(None, None, 3\)"
    ) as w:
        tfdata.pipeline(_jpegs(), batch_size=2, map_fn=decode)
    assert len([m for m in w if "unknown size" in str(m.message)]) == 1
    assert "tf.image.resize" in str(w[0].message) and "batch_map_fn" in str(w[0].message)

    def decode_and_resize(jpeg, label):
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (SIZE, SIZE)), label

    def double(tokens, label):
        return tokens * 2, label  # map_fn sees each row of a ragged feature as a dense tensor

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = tfdata.pipeline(_jpegs(), batch_size=2, map_fn=decode_and_resize)
        assert next(iter(ds))[0].shape == (2, SIZE, SIZE, 3)
        tokens = (tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]]), np.arange(4))
        ds = tfdata.pipeline(tokens, batch_size=2, map_fn=double, shuffle=False)
        assert [x.to_list() for x, _ in ds] == [[[2, 4], [6]], [[8, 10, 12], [14]]]
        assert [y.shape for _, y in ds] == [(2,), (2,)]  # dense stays dense


class _MeanOfRagged(keras.layers.Layer):
    def call(self, ragged):
        return tf.reshape(tf.reduce_mean(tf.cast(ragged, "float32"), axis=1), (-1, 1))


def _structure(name):
    """(source, model) for each element structure Keras `fit` accepts."""
    n = 16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = rng.integers(0, 2, n).astype("float32")
    inputs = keras.Input((3,))
    if name == "x_y":
        return (x, y), keras.Model(inputs, keras.layers.Dense(1)(inputs))
    if name == "x_y_sample_weight":
        weights = np.linspace(0.5, 1.5, n).astype("float32")
        return (x, y, weights), keras.Model(inputs, keras.layers.Dense(1)(inputs))
    if name == "dict_of_inputs":
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        out = keras.layers.Dense(1)(keras.layers.Concatenate()([a, b]))
        return ({"a": x, "b": x[:, :2]}, y), keras.Model({"a": a, "b": b}, out)
    if name == "dict_of_outputs":
        outputs = {"p": keras.layers.Dense(1)(inputs), "q": keras.layers.Dense(2)(inputs)}
        return (x, {"p": y, "q": x[:, :2]}), keras.Model(inputs, outputs)
    if name == "ragged":
        tokens = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]] * 4, dtype=tf.int64)
        ragged = keras.Input((None,), dtype="int64")
        return (tokens, y), keras.Model(ragged, keras.layers.Dense(1)(_MeanOfRagged()(ragged)))
    strings = keras.Input((), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(strings)
    out = keras.layers.Dense(1)(keras.layers.Embedding(5, 4)(ids))
    return (np.array(["a", "b", "c", "d"] * 4), y), keras.Model(strings, out)


@pytest.mark.parametrize(
    "name",
    ["x_y", "x_y_sample_weight", "dict_of_inputs", "dict_of_outputs", "ragged", "strings"],
)
@pytest.mark.slow
def test_every_structure_keras_accepts_reaches_fit_unchanged(name):
    source, model = _structure(name)
    train, val = tfdata.pipeline(source, batch_size=4, validation_split=0.25, seed=0)
    expected = tf.data.Dataset.from_tensor_slices(source).element_spec
    unbatched = tf.nest.map_structure(lambda s: s._unbatch(), train.element_spec)
    assert unbatched == expected and val.element_spec == train.element_spec
    loss = "mse" if name != "dict_of_outputs" else {"p": "mse", "q": "mse"}
    model.compile("sgd", loss)
    history = model.fit(train, validation_data=val, epochs=1, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])


@pytest.mark.slow
def test_the_text_recipe_of_the_docs(text_dir):
    """docs/data.md, "Text": the loader splits (every class on both sides), tfgpu vectorizes."""
    raw_train, raw_val = keras.utils.text_dataset_from_directory(
        text_dir, batch_size=None, validation_split=0.2, subset="both", seed=1337, verbose=False
    )
    vectorize_layer = keras.layers.TextVectorization(
        max_tokens=100, output_mode="int", output_sequence_length=SEQUENCE
    )
    vectorize_layer.adapt(raw_train.map(lambda text, label: text).batch(256))

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    train = tfdata.pipeline(raw_train, batch_size=4, batch_map_fn=vectorize_text)
    val = tfdata.pipeline(raw_val, batch_size=4, batch_map_fn=vectorize_text, shuffle=False)
    assert int(train.cardinality()) == 4 and int(val.cardinality()) == 1
    assert sorted(int(v) for _, y in val for v in y) == sorted(int(y) for _, y in raw_val)
    history = _text_model().fit(train, validation_data=val, epochs=1, verbose=0)
    assert {"loss", "val_loss"} <= set(history.history)


@pytest.mark.slow
def test_validation_under_mirrored_strategy_evaluates_every_example():
    """Keras evaluates the validation side's partial last batch under MirroredStrategy: the
    loss is the mean over all 21 validation examples, as on one device."""
    x = np.linspace(-1.0, 1.0, 105, dtype=np.float32)[:, None]
    y = 3.0 * x
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    train, val = tfdata.pipeline(
        (x, y), batch_size=4, strategy=strategy, validation_split=0.2, shuffle=False
    )
    assert sum(int(tf.shape(b)[0]) for b, _ in val) == 21
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        model.compile(loss="mse")
    model.layers[0].set_weights([np.ones((1, 1), np.float32)])
    history = model.fit(train, validation_data=val, epochs=1, verbose=0, shuffle=False)
    weight = float(model.layers[0].get_weights()[0][0, 0])
    expected = float(np.mean((weight * x[84:] - y[84:]) ** 2))
    np.testing.assert_allclose(history.history["val_loss"][0], expected, rtol=1e-5)
    np.testing.assert_allclose(model.evaluate(val, verbose=0), expected, rtol=1e-5)
    # A validation pipeline of its own (shuffle=False) keeps its partial batch too: all 21.
    alone = tfdata.pipeline((x[84:], y[84:]), batch_size=4, strategy=strategy, shuffle=False)
    np.testing.assert_allclose(model.evaluate(alone, verbose=0), expected, rtol=1e-5)
