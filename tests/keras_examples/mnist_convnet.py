"""Digits from MNIST with a two-block convnet, trained on NumPy arrays.

A script in the shape of keras.io's "Simple MNIST convnet" (arrays from `load_data`, a small
convnet, `fit` with `validation_split`), written for tfgpu's tests: tests/test_keras_examples.py
runs it under `tfgpu run` with small stand-in data.
"""

import keras
import numpy as np

CLASSES = 10
BATCH = 128
EPOCHS = 12

(train_images, train_labels), (test_images, test_labels) = keras.datasets.mnist.load_data()


def prepare(images):
    # uint8 in [0, 255] -> float32 in [0, 1], with a trailing channel axis for Conv2D
    return np.expand_dims(images.astype("float32") / 255.0, axis=-1)


x_train, x_test = prepare(train_images), prepare(test_images)
y_train = keras.utils.to_categorical(train_labels, CLASSES)
y_test = keras.utils.to_categorical(test_labels, CLASSES)
print(f"training images: {x_train.shape[0]}, each {x_train.shape[1:]}")
print(f"test images: {x_test.shape[0]}")

model = keras.Sequential(
    [
        keras.Input(shape=x_train.shape[1:]),
        keras.layers.Conv2D(24, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(48, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.4),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ],
    name="digits",
)
model.summary()
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss="categorical_crossentropy",
    metrics=["accuracy"],
)
model.fit(x_train, y_train, batch_size=BATCH, epochs=EPOCHS, validation_split=0.1)

loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f"held-out digits: loss {loss:.4f}, accuracy {accuracy:.2%}")
