"""Benign or malignant: skin-lesion photos read from TFRecord files in a GCS bucket, on a
frozen ImageNet Xception.

A script in the shape of keras.io's "How to train a Keras model on TFRecord files" (TFRecord
shards behind a `gs://` path, parsed and decoded in a `tf.data` pipeline, a pretrained
Xception base), written for tfgpu's tests: tests/test_keras_examples.py runs it under
`tfgpu run` with stand-in shards and weights. It carries a mistake carried over from Keras 2
code, the `lr=` argument of an optimizer, which Keras 3 refuses: it stops before its `fit`.
"""

import keras
import matplotlib.pyplot as plt
import tensorflow as tf

BUCKET = "gs://tfgpu-example-lesions/shards"
SIZE = 512
BATCH = 32
EPOCHS = 8

labelled = tf.io.gfile.glob(f"{BUCKET}/train-*.tfrec")
unlabelled = tf.io.gfile.glob(f"{BUCKET}/test-*.tfrec")
holdout = max(1, len(labelled) // 8)
train_files, val_files = labelled[holdout:], labelled[:holdout]
print(
    f"shards: {len(train_files)} to train, {len(val_files)} to validate, {len(unlabelled)} to score"
)

SCHEMA = {"image": tf.io.FixedLenFeature([], tf.string)}
LABELLED_SCHEMA = {**SCHEMA, "target": tf.io.FixedLenFeature([], tf.int64)}


def parse(record, with_label):
    fields = tf.io.parse_single_example(record, LABELLED_SCHEMA if with_label else SCHEMA)
    image = tf.io.decode_jpeg(fields["image"], channels=3)
    image = tf.cast(tf.reshape(image, (SIZE, SIZE, 3)), tf.float32)
    if with_label:
        return image, tf.cast(fields["target"], tf.float32)
    return image


def shards(files, with_label=True, shuffle=False):
    options = tf.data.Options()
    options.deterministic = False  # take records as the files deliver them
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).with_options(options)
    ds = ds.map(lambda r: parse(r, with_label), num_parallel_calls=tf.data.AUTOTUNE)
    if shuffle:
        ds = ds.shuffle(1024)
    return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


train_ds = shards(train_files, shuffle=True)
val_ds = shards(val_files)
score_ds = shards(unlabelled, with_label=False)

images, targets = next(iter(train_ds))
shown = min(16, len(images))
fig = plt.figure(figsize=(8, 8))
for i in range(shown):
    ax = fig.add_subplot(4, 4, i + 1)
    ax.imshow(images[i].numpy().astype("uint8"))
    ax.set_title("malignant" if targets[i] else "benign", fontsize=8)
    ax.axis("off")
fig.savefig("lesions.png")
plt.close(fig)


def build_classifier():
    backbone = keras.applications.Xception(
        include_top=False, weights="imagenet", input_shape=(SIZE, SIZE, 3)
    )
    backbone.trainable = False
    photo = keras.Input(shape=(SIZE, SIZE, 3))
    x = keras.applications.xception.preprocess_input(photo)
    x = backbone(x, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    malignant = keras.layers.Dense(1, activation="sigmoid")(x)
    classifier = keras.Model(photo, malignant, name="lesions")
    decay = keras.optimizers.schedules.ExponentialDecay(
        1e-3, decay_steps=50, decay_rate=0.9, staircase=True
    )
    classifier.compile(
        optimizer=keras.optimizers.Adam(lr=decay),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    return classifier


model = build_classifier()
model.fit(
    train_ds,
    validation_data=val_ds,
    epochs=EPOCHS,
    callbacks=[
        keras.callbacks.ModelCheckpoint("lesions.keras", save_best_only=True),
        keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
    ],
)

scores = model.predict(score_ds)
print(f"scored {len(scores)} photos; mean malignancy {float(scores.mean()):.3f}")
