"""Cats against dogs from a folder of photos, with a small convnet trained from scratch.

A script in the shape of keras.io's "Image classification from scratch" (a `PetImages/Cat`,
`PetImages/Dog` folder read by `image_dataset_from_directory`, augmentation, a convnet, a
checkpoint every epoch, one prediction), written for tfgpu's tests:
tests/test_keras_examples.py runs it under `tfgpu run` with a few stand-in photos.
"""

from pathlib import Path

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf

PHOTOS = Path("PetImages")
SIZE = (160, 160)
BATCH = 64
EPOCHS = 20

# Photo dumps collect files that are not JPEGs at all (empty, truncated, other formats);
# the decoder would stop training on them, so drop them first.
removed = []
for path in sorted(PHOTOS.glob("*/*")):
    with open(path, "rb") as f:
        head = f.read(3)
    if head != b"\xff\xd8\xff":  # every JPEG starts with this marker
        path.unlink()
        removed.append(path.name)
print(f"removed {len(removed)} file(s) that are not JPEGs: {', '.join(removed) or 'none'}")

train_ds, val_ds = keras.utils.image_dataset_from_directory(
    PHOTOS,
    labels="inferred",
    label_mode="binary",
    image_size=SIZE,
    batch_size=BATCH,
    validation_split=0.2,
    subset="both",
    seed=7,
)
classes = train_ds.class_names
print("classes:", classes)

augment = keras.Sequential(
    [keras.layers.RandomFlip("horizontal"), keras.layers.RandomZoom(0.15)], name="augment"
)

# A look at a few photos and at what the augmentation does to the first of them.
images, labels = next(iter(train_ds))
shown = min(6, len(images))
fig, axes = plt.subplots(2, shown, figsize=(2 * shown, 4), squeeze=False)
for i in range(shown):
    axes[0, i].imshow(images[i].numpy().astype("uint8"))
    axes[0, i].set_title(classes[int(labels[i][0])])
    axes[1, i].imshow(
        np.clip(augment(images[:1], training=True)[0].numpy(), 0, 255).astype("uint8")
    )
for ax in axes.flat:
    ax.axis("off")
fig.savefig("preview.png")
plt.close(fig)

# Random augmentation in the input pipeline, on the CPU, next to the decoding.
train_ds = train_ds.map(
    lambda x, y: (augment(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE
).prefetch(tf.data.AUTOTUNE)
val_ds = val_ds.prefetch(tf.data.AUTOTUNE)


def conv_block(x, filters):
    shortcut = keras.layers.Conv2D(filters, 1, strides=2, padding="same")(x)
    x = keras.layers.SeparableConv2D(filters, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.MaxPooling2D(2, padding="same")(x)
    return keras.layers.Add()([x, shortcut])


inputs = keras.Input(shape=(*SIZE, 3))
x = keras.layers.Rescaling(1 / 127.5, offset=-1)(inputs)
x = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
for filters in (48, 96):
    x = conv_block(x, filters)
x = keras.layers.GlobalAveragePooling2D()(x)
x = keras.layers.Dropout(0.3)(x)
outputs = keras.layers.Dense(1)(x)  # a logit: > 0 means the second class
model = keras.Model(inputs, outputs, name="pets")
keras.utils.plot_model(model, to_file="pets.png", show_shapes=True)

model.compile(
    optimizer=keras.optimizers.Adam(5e-4),
    loss=keras.losses.BinaryCrossentropy(from_logits=True),
    metrics=[keras.metrics.BinaryAccuracy(name="acc", threshold=0.0)],
)
model.fit(
    train_ds,
    validation_data=val_ds,
    epochs=EPOCHS,
    callbacks=[keras.callbacks.ModelCheckpoint("save_at_{epoch}.keras")],
)

photo = PHOTOS / "Cat" / "6779.jpg"
pixels = keras.utils.img_to_array(keras.utils.load_img(photo, target_size=SIZE))
logit = model.predict(pixels[np.newaxis], verbose=0)[0, 0]
second = float(keras.ops.sigmoid(logit))
print(f"{photo}: {classes[0]} with probability {1 - second:.3f}, {classes[1]} {second:.3f}")
