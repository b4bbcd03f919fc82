"""Positive or negative: IMDB reviews classified by a 1D convnet over learned word vectors.

A script in the shape of keras.io's "Text classification from scratch" (the IMDB archive from
`get_file`, `text_dataset_from_directory`, a `TextVectorization` layer adapted on the reviews,
an Embedding + Conv1D model), written for tfgpu's tests: tests/test_keras_examples.py runs it
under `tfgpu run` with a small stand-in archive.
"""

import os
import string

import keras
import tensorflow as tf

URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
VOCABULARY = 15000
LENGTH = 300
BATCH = 32
EPOCHS = 4

root = keras.utils.get_file("aclImdb_v1.tar.gz", URL, untar=True)
reviews = os.path.join(root, "aclImdb")


def reviews_from(split, **kwargs):
    # Only pos/ and neg/ are labelled; train/ also holds unsup/, which class_names leaves out.
    return keras.utils.text_dataset_from_directory(
        os.path.join(reviews, split), class_names=["neg", "pos"], batch_size=BATCH, **kwargs
    )


train_text, val_text = reviews_from("train", validation_split=0.25, subset="both", seed=42)
test_text = reviews_from("test")
for name, ds in (("train", train_text), ("validation", val_text), ("test", test_text)):
    print(f"{name}: {int(ds.cardinality())} batches of up to {BATCH} reviews")

texts, labels = next(iter(train_text))
for text, label in zip(texts[:3].numpy(), labels[:3].numpy()):
    print(f"[{'pos' if label else 'neg'}] {text[:70]!r}")

PUNCTUATION = "[" + "".join("\\" + c for c in string.punctuation) + "]"


def clean(text):
    # The reviews keep HTML line breaks; the default standardization would leave "br" words.
    text = tf.strings.regex_replace(tf.strings.lower(text), "<br\\s*/?>", " ")
    return tf.strings.regex_replace(text, PUNCTUATION, " ")


to_ids = keras.layers.TextVectorization(
    max_tokens=VOCABULARY, standardize=clean, output_sequence_length=LENGTH
)
to_ids.adapt(train_text.map(lambda text, label: text))
print(f"vocabulary: {to_ids.vocabulary_size()} tokens")


def encode(text, label):
    return to_ids(text), label


# Encode once, keep the integer sequences in memory, overlap input with training.
train_ds = train_text.map(encode, num_parallel_calls=tf.data.AUTOTUNE).cache()
val_ds = val_text.map(encode, num_parallel_calls=tf.data.AUTOTUNE).cache()
test_ds = test_text.map(encode, num_parallel_calls=tf.data.AUTOTUNE).cache()
train_ds, val_ds, test_ds = (ds.prefetch(tf.data.AUTOTUNE) for ds in (train_ds, val_ds, test_ds))

tokens = keras.Input(shape=(LENGTH,), dtype="int64")
x = keras.layers.Embedding(VOCABULARY, 64)(tokens)
x = keras.layers.SpatialDropout1D(0.2)(x)
x = keras.layers.Conv1D(96, 5, strides=2, activation="relu")(x)
x = keras.layers.Conv1D(96, 5, strides=2, activation="relu")(x)
x = keras.layers.GlobalMaxPooling1D()(x)
x = keras.layers.Dense(64, activation="relu")(x)
x = keras.layers.Dropout(0.4)(x)
positive = keras.layers.Dense(1, activation="sigmoid", name="positive")(x)
model = keras.Model(tokens, positive, name="review_cnn")
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
model.fit(train_ds, validation_data=val_ds, epochs=EPOCHS)

loss, accuracy = model.evaluate(test_ds, verbose=0)
print(f"test reviews: accuracy {accuracy:.3f} (loss {loss:.3f})")

# Raw strings in, a probability out: the vectorizer in front of the trained model.
raw = keras.Input(shape=(1,), dtype="string")
reader = keras.Model(raw, model(to_ids(raw)), name="review_reader")
samples = tf.constant([["A warm, funny film with a great cast."], ["Dull, and far too long."]])
for sample, score in zip(samples[:, 0].numpy(), reader.predict(samples, verbose=0)[:, 0]):
    print(f"{score:.2f} positive: {sample.decode()}")
